"""What DRA drivers publish, and what their node half hands a container: DeviceClasses and
ResourceSlices in the shapes of NVIDIA's DRA driver (``gpu.nvidia.com`` full GPUs, optionally
shareable by consumable memory; ``mig.nvidia.com`` MIG devices) and HAMi's (``memory`` and
``cores`` consumable by many claims), and the environment a container gets for an allocated claim.

Pure data: the node side (node_side.py) publishes a :class:`DraDriver`'s slices as each node's
identity and its DeviceClasses as the administrator (a driver's Helm chart makes them); the
kubelet (kubelet.py) asks :func:`claim_environment` what to add to a container that uses claims.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .nodes import quantity

NVIDIA = "gpu.nvidia.com"
HAMI = "hami-core-gpu.project-hami.io"


def device_class(name: str, driver: str, device_type: str) -> dict[str, Any]:
    expression = f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def nvidia_gpu(
    index: int, memory: str = "80Gi", product: str = "NVIDIA A100-SXM4-80GB", shared: bool = False
) -> dict[str, Any]:
    """A full GPU as NVIDIA's DRA driver publishes it (``shared``: its consumable shares on)."""
    device: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            "productName": {"string": product},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
        },
        "capacity": {"memory": {"value": memory}},
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"]["requestPolicy"] = {
            "default": memory,
            "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
        }
    return device


def nvidia_mig(parent: int, profile: str, number: int) -> dict[str, Any]:
    memory_gb = int(profile.split(".")[1].removesuffix("gb"))
    return {
        "name": f"gpu-{parent}-mig-{profile.replace('.', '')}-{number}",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{uuid.uuid4()}"},
            "parentUUID": {"string": f"GPU-parent-{parent}"},
            "profile": {"string": profile},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": f"{memory_gb}Gi"}, "multiprocessors": {"value": "14"}},
    }


def hami_gpu(index: int, memory: str = "80Gi") -> dict[str, Any]:
    """A GPU as HAMi's DRA driver publishes it: memory and cores consumable by many claims."""
    return {
        "name": f"hami-gpu-{index}",
        "attributes": {
            "type": {"string": "hami-gpu"},
            "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {
            "memory": {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
        "allowMultipleAllocations": True,
    }


@dataclass(frozen=True)
class DraDriver:
    """A DRA driver across a cluster's nodes: its ResourceSlices (one per node) and DeviceClasses."""

    name: str
    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]

    def devices(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every device by (pool, device name), as an allocation result names it."""
        return {
            (piece["spec"]["pool"]["name"], device["name"]): device
            for piece in self.slices
            for device in piece["spec"]["devices"]
        }


def nvidia_driver(count: int = 4, mig_node: bool = True, shared: bool = False) -> DraDriver:
    """NVIDIA's driver: one 80 GiB A100 per node; the last node's card split into MIG devices
    (two 1g.10gb, one 3g.40gb) where ``mig_node``; ``shared``: consumable memory on."""
    slices = []
    for index in range(1, count + 1):
        node = f"gpu-node-{index}"
        if mig_node and index == count:
            devices = [nvidia_mig(0, "1g.10gb", 0), nvidia_mig(0, "1g.10gb", 1), nvidia_mig(0, "3g.40gb", 0)]
        else:
            devices = [nvidia_gpu(0, shared=shared)]
        slices.append(resource_slice(node, NVIDIA, devices))
    classes = [device_class("gpu.nvidia.com", NVIDIA, "gpu"), device_class("mig.nvidia.com", NVIDIA, "mig")]
    return DraDriver(NVIDIA, slices, classes)


def hami_driver(count: int = 4) -> DraDriver:
    """HAMi's driver: one 80 GiB GPU per node, memory and cores consumable."""
    slices = [resource_slice(f"gpu-node-{index}", HAMI, [hami_gpu(0)]) for index in range(1, count + 1)]
    return DraDriver(HAMI, slices, [device_class(HAMI, HAMI, "hami-gpu")])


def consumed_per_device(
    claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], tuple[int, int]]:
    """For a test's own check: ``(pool, device) -> (memory held by allocated claims, capacity)``,
    counting an allocation without consumed capacity as the whole device."""
    capacity: dict[tuple[str, str], int] = {}
    for piece in slices:
        for device in piece["spec"].get("devices") or []:
            memory = (device.get("capacity") or {}).get("memory") or {}
            capacity[(piece["spec"]["pool"]["name"], device["name"])] = int(
                quantity(str(memory.get("value", "0")))
            )
    held: dict[tuple[str, str], int] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (result["pool"], result["device"])
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            amount = int(quantity(str(consumed))) if consumed is not None else capacity.get(key, 0)
            held[key] = held.get(key, 0) + amount
    return {key: (held.get(key, 0), total) for key, total in capacity.items()}


# ---- the node half: what a prepared claim puts into a container ------------------------------


def _mebibytes(amount: str) -> int:
    return int(quantity(amount)) // 2**20


def claim_environment(
    allocations: Iterable[Mapping[str, Any]], devices: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[str, str]:
    """The environment the drivers' container edits (CDI) give a container for its allocated
    claims (each ``status.allocation``): the devices' UUIDs in ``NVIDIA_VISIBLE_DEVICES``;
    NVIDIA's MPS sharing config as MPS client variables; HAMi's consumed memory and cores as
    HAMi-core's limits. A stand-in for the drivers' node half: no device is prepared."""
    env: dict[str, str] = {}
    visible: list[str] = []
    for allocation in allocations:
        results = (allocation.get("devices") or {}).get("results") or []
        for result in results:
            device = devices.get((result["pool"], result["device"]))
            if device is None:
                continue
            visible.append(device["attributes"]["uuid"]["string"])
            consumed = result.get("consumedCapacity") or {}
            if result["driver"] == HAMI:
                if "memory" in consumed:
                    env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{_mebibytes(consumed['memory'])}m"
                if "cores" in consumed:
                    env["CUDA_DEVICE_SM_LIMIT"] = str(consumed["cores"])
        for entry in (allocation.get("devices") or {}).get("config") or []:
            sharing = ((entry.get("opaque") or {}).get("parameters") or {}).get("sharing") or {}
            mps = sharing.get("mpsConfig") if sharing.get("strategy") == "MPS" else None
            if mps:
                env["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp/nvidia-mps"
                if "defaultPinnedDeviceMemoryLimit" in mps:
                    limit = _mebibytes(mps["defaultPinnedDeviceMemoryLimit"])
                    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
                if "defaultActiveThreadPercentage" in mps:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps["defaultActiveThreadPercentage"])
    if visible:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(visible)
    return env
