"""The real node as a GPU node: NVIDIA's device plugin registered with its kubelet over the
simulated NVML, the container toolkit's stand-in giving GPU containers that NVML
(nvidia_runtime.py), the kernel image in its containerd, and the labels GPU Feature Discovery
would give it (GFD itself cannot be built here: its module needs one the Go proxy refuses).

One context manager for every test that runs kernels on the real node, so that they all bring
the node up the same way and wait for the same thing: the plugin's resource in the node's
``allocatable``, which is what kube-scheduler places by.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..support.nvml_sim import SimulatedCard, driver_root, write_state
from ..support.polling import wait_until
from .controlplane import ControlPlane
from .images import kernel_image
from .nvidia_device_plugin import find, start
from .nvidia_runtime import NvidiaRuntime
from .real_node import RealNode
from .rest import NODES

ADVERTISE_TIMEOUT = 120.0  # seconds for the kubelet to put a resource in the node's status


@dataclass(frozen=True)
class GpuNode:
    node: RealNode
    state: Path  # the simulated NVML's state file: write_state() here changes what the cards say
    cards: tuple[SimulatedCard, ...]


@contextlib.contextmanager
def gpu_node(
    plane: ControlPlane,
    workdir: Path,
    cards: Sequence[SimulatedCard],
    plugin_config: Path,
    advertised: tuple[str, int],
    *,
    labels: Mapping[str, str],
    image_names: Iterable[str] = (),
    extended_resources: Mapping[str, str] | None = None,
) -> Iterator[GpuNode]:
    """The real node in ``workdir`` running NVIDIA's device plugin with ``plugin_config`` (its
    own file format) over ``cards``, ready once the node's allocatable has ``advertised``
    (resource, count). ``image_names``: other names of the kernel image in the node's containerd,
    as ``docker build -t`` would have named it (no registry is reachable here).
    ``extended_resources``: node-level resources put into the node's status as an administrator
    advertises them (``PATCH nodes/NAME/status``), for what a device plugin that cannot run here
    would have advertised; the kubelet keeps them and derives their allocatable."""
    workdir.mkdir(parents=True, exist_ok=True)
    state = write_state(workdir / "nvml" / "state", cards)  # alone in its directory: mounted
    image = kernel_image()
    runtime = NvidiaRuntime(driver_root().library, state)  # GPU containers get the library
    with RealNode(plane, workdir / "node", labels=labels, nvidia_runtime=runtime) as node:
        node.ctr("images", "import", str(image.archive))
        for name in image_names:
            node.ctr("images", "tag", "--force", image.reference, name)
        plugin = start(find().plugin, driver_root(), state, plugin_config, workdir / "device-plugin.log")
        try:
            expected = {advertised[0]: str(advertised[1]), **(extended_resources or {})}
            if extended_resources:
                plane.admin.patch(
                    NODES, node.name, {"status": {"capacity": dict(extended_resources)}}, subresource="status"
                )
            wait_until(
                lambda: ((plane.admin.get(NODES, node.name) or {}).get("status") or {}).get(
                    "allocatable", {}
                ),
                ADVERTISE_TIMEOUT,
                0.5,
                f"{expected} in {node.name}'s allocatable (NVIDIA's device plugin: "
                f"{workdir / 'device-plugin.log'})",
                until=lambda allocatable: all(allocatable.get(k) == v for k, v in expected.items()),
            )
            yield GpuNode(node, state, tuple(cards))
        finally:
            plugin.terminate()
            plugin.wait(30)
