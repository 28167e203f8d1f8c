"""What DRA drivers publish, for the simulated cluster: DeviceClasses and ResourceSlices in the
shapes of NVIDIA's DRA driver (``gpu.nvidia.com`` full GPUs, optionally shareable by consumable
memory; ``mig.nvidia.com`` MIG devices) and HAMi's (``memory`` and ``cores`` consumable by many
claims), and the clusters the DRA tests run: nodes with no extended GPU resources whose GPUs are
in ResourceSlices, with a :class:`~.dra.DraSimulation` to allocate them.
"""

from __future__ import annotations

import uuid
from typing import Any

from .dra import DraSimulation
from .nodes import SimNode


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


NVIDIA = "gpu.nvidia.com"
HAMI = "hami-core-gpu.project-hami.io"


def dra_nodes(count: int = 4) -> list[SimNode]:
    """Nodes with no extended GPU resources: their GPUs are in ResourceSlices."""
    return [SimNode(f"gpu-node-{index}", {}) for index in range(1, count + 1)]


def nvidia_cluster(count: int = 4, mig_node: bool = True, shared: bool = False) -> DraSimulation:
    """NVIDIA's driver: one 80 GiB A100 per node; the last node's card split into MIG devices
    (two 1g.10gb, one 3g.40gb) where ``mig_node``."""
    slices = []
    for index in range(1, count + 1):
        node = f"gpu-node-{index}"
        if mig_node and index == count:
            devices = [nvidia_mig(0, "1g.10gb", 0), nvidia_mig(0, "1g.10gb", 1), nvidia_mig(0, "3g.40gb", 0)]
        else:
            devices = [nvidia_gpu(0, shared=shared)]
        slices.append(resource_slice(node, NVIDIA, devices))
    classes = [device_class("gpu.nvidia.com", NVIDIA, "gpu"), device_class("mig.nvidia.com", NVIDIA, "mig")]
    return DraSimulation(slices, classes)


def hami_cluster(count: int = 4) -> DraSimulation:
    slices = [resource_slice(f"gpu-node-{index}", HAMI, [hami_gpu(0)]) for index in range(1, count + 1)]
    return DraSimulation(slices, [device_class(HAMI, HAMI, "hami-gpu")])
