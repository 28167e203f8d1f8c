"""The simulated GPU nodes, and the resources a pod asks of one.

Tests describe the cluster's nodes as :class:`SimNode`\\ s (``hami_nodes`` gives the usual
four); the scheduler (scheduler.py) places pods by their :func:`pod_limits` against the nodes'
allocatable resources, in the API's quantities (:func:`quantity`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SimNode:
    """One node: its name, what it can allocate, and its labels (as GPU Feature Discovery or
    HAMi write them)."""

    name: str
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """The Node object the API serves for it."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name, **self.labels}},
            "status": {"allocatable": dict(self.allocatable), "capacity": dict(self.allocatable)},
        }


def hami_nodes(count: int = 4, gpumem_mib: int = 81920, card_mib: int = 81920) -> list[SimNode]:
    """``count`` nodes with one 80 GiB card each, as HAMi advertises them (10 vGPUs per card).

    ``gpumem_mib`` below ``card_mib``: part of each card's vGPU memory is promised elsewhere, so
    a slice can fit a card and still find no room (the scheduler says "Insufficient").
    """
    return [
        SimNode(
            f"gpu-node-{index}",
            {"nvidia.com/gpu": "10", "nvidia.com/gpumem": str(gpumem_mib), "nvidia.com/gpucores": "100"},
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": str(card_mib)},
        )
        for index in range(1, count + 1)
    ]


def quantity(text: str) -> float:
    """An API quantity (``10``, ``6144``, ``500m``, ``2Gi``) as a number."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 0.001, "k": 1000, "M": 10**6, "G": 10**9}
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
