"""What a GPU device plugin's answer to kubelet's Allocate gives a container on the simulated
nodes: a stand-in for the node half of the NVIDIA device plugin and HAMi's (no device is
prepared), as dra_devices.claim_environment is for DRA drivers.

A container that is given a device through an extended resource (``nvidia.com/gpu``, a MIG
profile, a renamed shared resource) gets its UUID in ``NVIDIA_VISIBLE_DEVICES``, for the container
runtime; HAMi's memory and cores requests become HAMi-core's limits. Nothing sets
``CUDA_VISIBLE_DEVICES`` in a pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .nodes import quantity

# HAMi's counters: they size the slice of the device that nvidia.com/gpu gives, not a device.
HAMI_MEMORY, HAMI_CORES = "nvidia.com/gpumem", "nvidia.com/gpucores"
NOT_DEVICES = {"cpu", "memory", "ephemeral-storage", HAMI_MEMORY, "nvidia.com/gpumem-percentage", HAMI_CORES}


def device_uuid(node: str) -> str:
    """The one card of simulated node ``node``, named as NVML names a GPU."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'kube-testcluster/{node}')}"


def device_plugin_environment(container: Mapping[str, Any], node: str) -> dict[str, str]:
    """What the device plugins add to ``container``'s environment on ``node`` (nothing for a
    container that asks for no device)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    if not any(name not in NOT_DEVICES and not name.startswith("hugepages-") for name in limits):
        return {}
    env = {"NVIDIA_VISIBLE_DEVICES": device_uuid(node)}
    if HAMI_MEMORY in limits:
        env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{int(quantity(limits[HAMI_MEMORY]))}m"
    if HAMI_CORES in limits:
        env["CUDA_DEVICE_SM_LIMIT"] = str(int(quantity(limits[HAMI_CORES])))
    return env
