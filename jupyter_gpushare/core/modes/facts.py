"""Probing the node for what modes need (I/O kept out of the mode objects)."""

from __future__ import annotations

import os
import stat

from jupyter_gpushare.core.devices import Inventory
from jupyter_gpushare.core.modes.base import NodeFacts

DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"


def probe_node(
    inventory: Inventory,
    libvgpu_path: str = "",
    mps_pipe_directory: str = "",
    vgpu_cache_directory: str = "/tmp",
) -> NodeFacts:
    pipe_directory = mps_pipe_directory or os.environ.get(
        "CUDA_MPS_PIPE_DIRECTORY", DEFAULT_MPS_PIPE_DIRECTORY
    )
    return NodeFacts(
        simulated=inventory.simulated,
        has_devices=bool(inventory.devices),
        mig_instances=sum(len(device.mig) for device in inventory.devices),
        mps_pipe_directory=pipe_directory if _is_fifo(os.path.join(pipe_directory, "control")) else None,
        libvgpu_path=libvgpu_path if libvgpu_path and os.path.isfile(libvgpu_path) else None,
        vgpu_cache_directory=vgpu_cache_directory,
    )


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False
