"""What a kernel pod asks the cluster for in the device plugins' dialect, and the pieces the
modes build theirs from (docs/how-it-works/modes.md, the Kubernetes column). Pure.

Kubernetes does the placing; a mode only translates a slice request into the resources,
annotations, labels and scheduler the cluster's sharing layer understands, plus the soft caps a
kernel gets where nothing below enforces the slice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.framework_budget import framework_budget
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.sizes import GiB, Size, format_bytes

_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")


@dataclass(frozen=True)
class PodRequest:
    resources: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    memory: int | None = None  # bytes the slice stands for, where known before scheduling
    # Dynamic Resource Allocation: the ResourceClaim spec the pod's claim carries (.claims).
    claim: dict[str, Any] | None = None


# KubeSpawner's placeholder for the value a user types (its ``{value}`` template).
TYPED_VALUE = "{value}"


@dataclass(frozen=True)
class TemplatedRequest:
    """A pod request for an amount typed in later: :data:`TYPED_VALUE` in its resources and
    annotations stands for a whole number of ``unit`` (the custom size of a YAML profile list,
    which can hold no code to convert a size)."""

    unit: Literal["MiB", "GiB"]
    request: PodRequest


def whole_card(cluster: ClusterFacts) -> PodRequest:
    return PodRequest({cluster.preset.gpu: "1"}, memory=cluster.gpu_memory)


def shared_replica(resource: str, size: Size, cluster: ClusterFacts) -> PodRequest:
    """One replica of a shared card (time-slicing, MPS) with the soft caps for the size."""
    if size.is_whole:
        return whole_card(cluster)  # no sharing resource can express a whole card
    memory = bytes_for(size, cluster.gpu_memory, percent_resource=False)
    return PodRequest({resource: "1"}, env=soft_caps(memory, cluster.gpu_memory), memory=memory)


def bytes_for(size: Size, gpu_memory: int | None, percent_resource: bool) -> int | None:
    """Bytes a size means in the cluster; None when a percentage resource will carry it."""
    if size.form == "bytes":
        return size.resolve(0)
    if gpu_memory is not None:
        return size.resolve(gpu_memory)
    if percent_resource:
        return None
    raise InvalidRequestError(
        f"a share such as {size} needs the cards' memory: label the nodes with GPU Feature "
        "Discovery (nvidia.com/gpu.memory) or ask for an amount such as 8G"
    )


def soft_caps(memory: int | None, gpu_memory: int | None) -> dict[str, str]:
    """The framework variables that hold a kernel to its slice where nothing below does."""
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    if memory is not None:
        budget = framework_budget(memory)  # the slice less the process's CUDA context
        env["CUPY_GPU_MEMORY_LIMIT"] = str(budget)
        if gpu_memory:
            fraction = int(budget * 10_000 / gpu_memory) / 10_000
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
    return env


def smallest_mig_profile(size: Size, cluster: ClusterFacts) -> tuple[str, int]:
    """``(profile, bytes)`` of the smallest of ``cluster.mig_profiles`` that holds the size (the
    least compute among profiles of equal memory); the device-plugin and DRA dialects share it."""
    profiles = cluster.mig_profiles
    if size.is_whole:
        raise InvalidRequestError("'whole' is not a MIG size; use mode 'exclusive' for a whole card")
    wanted = bytes_for(size, cluster.gpu_memory, percent_resource=False)
    assert wanted is not None
    fitting = []
    for profile in profiles:
        match = _MIG_PROFILE.match(profile)
        if match and int(match.group(2)) * GiB >= wanted:
            fitting.append((int(match.group(2)), int(match.group(1)), profile))
    if not fitting:
        raise InvalidRequestError(
            f"{size} is larger than any MIG profile the cluster offers ({', '.join(profiles)})"
        )
    memory_gb, _, profile = min(fitting)
    return profile, memory_gb * GiB


def describe(request: PodRequest) -> str:
    """One line for logs and the CLI."""
    parts = [f"{name}={value}" for name, value in sorted(request.resources.items())]
    parts += [f"{name}={value} (annotation)" for name, value in sorted(request.annotations.items())]
    memory = f", slice {format_bytes(request.memory)}" if request.memory else ""
    return ", ".join(parts) + memory


__all__ = [
    "TYPED_VALUE",
    "PodRequest",
    "TemplatedRequest",
    "bytes_for",
    "describe",
    "shared_replica",
    "smallest_mig_profile",
    "soft_caps",
    "whole_card",
]
