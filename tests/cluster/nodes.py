"""The simulated GPU nodes: what each advertises, as the device plugins and GPU Feature Discovery
publish it, and the Node and Lease objects a kubelet keeps for it.

Tests describe a cluster's nodes as :class:`SimNode`\\ s; the functions below give the usual
four 80 GiB nodes in each dialect:

* :func:`device_plugin_nodes` — NVIDIA's device plugin: ``nvidia.com/gpu`` (one per card, or
  ``replicas`` per card when time-slicing or MPS sharing is configured), GFD's labels;
* :func:`hami_nodes` — HAMi: ten vGPUs per card, ``nvidia.com/gpumem`` (MiB), ``gpucores``;
* :func:`volcano_nodes` — Volcano vGPU: ``volcano.sh/vgpu-number``, ``-memory`` (MiB), ``-cores``;
* :func:`kai_nodes` — KAI's GPU sharing: whole ``nvidia.com/gpu`` cards, memory asked by
  annotation and placed by the KAI scheduler;
* :func:`aliyun_nodes` — Aliyun cGPU: ``aliyun.com/gpu-mem`` in GiB, ``aliyun.com/gpu-count``;
* :func:`dra_nodes` — no extended resources: the GPUs are in a DRA driver's ResourceSlices
  (dra_devices.py).

The node side (node_side.py) registers each node as that node's own identity
(``system:node:NAME``), with the ``Ready`` condition, and renews its Lease every 10 s, so the
real node-lifecycle controller sees a healthy node.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, field
from typing import Any

# What every simulated node has besides GPUs: enough for any test's pods.
BASE_RESOURCES = {"cpu": "16", "memory": "128Gi", "pods": "110", "ephemeral-storage": "500Gi"}
A100 = "NVIDIA-A100-SXM4-80GB"
CARD_MIB = 81920
LEASE_SECONDS = 40  # kubelet's default lease duration
RENEW_SECONDS = 10  # kubelet renews at a quarter of it


@dataclass
class SimNode:
    """One node: its name, the extended resources it can allocate, and its labels (as GPU Feature
    Discovery or a vendor's device plugin write them)."""

    name: str
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self, kubelet_port: int = 10250, version: str = "v1.34.0") -> dict[str, Any]:
        """The Node object as its kubelet registers it: labels, capacity, a ``Ready`` condition,
        the address and port the API server reaches the kubelet at (pod logs)."""
        resources = {**BASE_RESOURCES, **self.allocatable}
        now = timestamp()
        conditions = [
            (
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **self.labels,
                },
            },
            "spec": {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": [
                    {
                        "type": kind,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                    for kind, status, reason, message in conditions
                ],
                # Only an InternalIP: the API server would try a Hostname address first, and
                # the simulated nodes' names resolve nowhere.
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
                "nodeInfo": {
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, self.name).hex,
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, self.name)),
                    "bootID": str(uuid.uuid4()),
                    "kernelVersion": "6.1.0",
                    "osImage": "simulated GPU node (jupyter-gpushare tests)",
                    "containerRuntimeVersion": "simulated://1.0",
                    "kubeletVersion": version,
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }

    def lease(self, node_uid: str) -> dict[str, Any]:
        """The node's Lease in ``kube-node-lease``, owned by the Node as kubelet makes it."""
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node_uid}],
            },
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": micro_timestamp(),
            },
        }


def timestamp() -> str:
    """Now, as the API writes a Time (RFC 3339, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_timestamp() -> str:
    """Now, as the API writes a MicroTime (a Lease's renewTime, an event's eventTime)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def gfd_labels(
    product: str = A100, memory_mib: int = CARD_MIB, count: int = 1, replicas: int = 1
) -> dict[str, str]:
    """GPU Feature Discovery's labels for a node's cards."""
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/mig.strategy": "single",
    }


def names(count: int) -> list[str]:
    return [f"gpu-node-{index}" for index in range(1, count + 1)]


def device_plugin_nodes(count: int = 4, replicas: int = 1) -> list[SimNode]:
    """NVIDIA's device plugin: one 80 GiB card per node, ``replicas`` shares of it when
    time-slicing or MPS is configured (the plugin then advertises ``nvidia.com/gpu: replicas``)."""
    return [
        SimNode(name, {"nvidia.com/gpu": str(replicas)}, gfd_labels(replicas=replicas))
        for name in names(count)
    ]


def hami_nodes(count: int = 4, gpumem_mib: int = CARD_MIB, card_mib: int = CARD_MIB) -> list[SimNode]:
    """``count`` nodes with one 80 GiB card each, as HAMi advertises them (10 vGPUs per card).

    ``gpumem_mib`` below ``card_mib``: part of each card's vGPU memory is promised elsewhere, so
    a slice can fit a card and still find no room (the scheduler says "Insufficient").
    """
    return [
        SimNode(
            name,
            {"nvidia.com/gpu": "10", "nvidia.com/gpumem": str(gpumem_mib), "nvidia.com/gpucores": "100"},
            {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": str(card_mib)},
        )
        for name in names(count)
    ]


def volcano_nodes(count: int = 4) -> list[SimNode]:
    """Volcano's vGPU device plugin: ten vGPUs per 80 GiB card, memory in MiB, cores in percent."""
    resources = {
        "volcano.sh/vgpu-number": "10",
        "volcano.sh/vgpu-memory": str(CARD_MIB),
        "volcano.sh/vgpu-cores": "100",
    }
    return [SimNode(name, dict(resources), gfd_labels()) for name in names(count)]


def kai_nodes(count: int = 4) -> list[SimNode]:
    """KAI's GPU sharing: nodes advertise whole cards; fractions are the KAI scheduler's."""
    return [SimNode(name, {"nvidia.com/gpu": "1"}, gfd_labels()) for name in names(count)]


def aliyun_nodes(count: int = 4) -> list[SimNode]:
    """Aliyun's cGPU device plugin: memory in GiB, the number of cards."""
    return [
        SimNode(name, {"aliyun.com/gpu-mem": "80", "aliyun.com/gpu-count": "1"}, gfd_labels())
        for name in names(count)
    ]


def dra_nodes(count: int = 4) -> list[SimNode]:
    """Nodes with no extended GPU resources: their GPUs are in ResourceSlices."""
    return [SimNode(name, {}) for name in names(count)]


def quantity(text: str) -> float:
    """An API quantity (``10``, ``6144``, ``500m``, ``2Gi``) as a number."""
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "m": 0.001,
        "k": 1000,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def pod_limits(pod: dict[str, Any]) -> dict[str, float]:
    """The resource limits of a pod's containers, summed by resource name."""
    totals: dict[str, float] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
            totals[name] = totals.get(name, 0.0) + quantity(str(value))
    return totals
