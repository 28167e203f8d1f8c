"""What a pod asks the cluster for, by mode (docs/how-it-works/modes.md table, Kubernetes column). Pure.

Kubernetes does the placing; we only translate a slice request into the resources, annotations,
labels and scheduler the cluster's sharing layer understands, plus the soft caps a kernel gets
where nothing below enforces the slice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.presets import ResourcePreset
from jupyter_gpushare.core.errors import InvalidRequestError, ModeUnavailableError
from jupyter_gpushare.core.framework_budget import framework_budget
from jupyter_gpushare.core.sizes import GiB, MiB, Size, format_bytes

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


@dataclass(frozen=True)
class ClusterFacts:
    """What the cluster offers that pod requests depend on."""

    preset: ResourcePreset
    mig_profiles: Sequence[str] = ()
    gpu_memory: int | None = None  # the cards' memory (GPU Feature Discovery), where known
    gpu_type: str | None = None
    queue: str | None = None
    fallbacks: Sequence[str] = ()  # DRA: modes a claim may fall back to (c.GPUShare.dra_fallbacks)


def pod_request(mode: str, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
    """Resources for one kernel's slice in ``mode`` (a name the mode objects know)."""
    try:
        translate = POD_REQUESTS[mode]
    except KeyError:
        raise InvalidRequestError(
            f"no pod request for mode {mode!r}; modes: {', '.join(POD_REQUESTS)}"
        ) from None
    return translate(size, cores, cluster)


def whole_card(cluster: ClusterFacts) -> PodRequest:
    return PodRequest({cluster.preset.gpu: "1"}, memory=cluster.gpu_memory)


def timeslice_request(size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
    return shared_replica(cluster.preset.timeslice_gpu, size, cluster)


def mps_request(size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
    request = shared_replica(cluster.preset.mps_gpu, size, cluster)
    # The device plugin's MPS sharing enforces memory per client through the same variables.
    if request.memory is not None and not size.is_whole:
        request.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={request.memory // MiB}M"
    if cores is not None:
        request.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
    return request


def shared_replica(resource: str, size: Size, cluster: ClusterFacts) -> PodRequest:
    """One replica of a shared card (time-slicing, MPS) with the soft caps for the size."""
    if size.is_whole:
        return whole_card(cluster)  # no sharing resource can express a whole card
    memory = bytes_for(size, cluster.gpu_memory, percent_resource=False)
    return PodRequest({resource: "1"}, env=soft_caps(memory, cluster.gpu_memory), memory=memory)


def bytes_for(size: Size, gpu_memory: int | None, percent_resource: bool) -> int | None:
    """Bytes a size means in the cluster; None when a percentage resource will carry it."""
    if size.kind == "bytes":
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
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    if memory is not None:
        budget = framework_budget(memory)  # the slice less the process's CUDA context
        env["CUPY_GPU_MEMORY_LIMIT"] = str(budget)
        if gpu_memory:
            fraction = int(budget * 10_000 / gpu_memory) / 10_000
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
    return env


def vgpu_request(size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
    """HAMi-style virtual GPU: memory (and cores) as resources or annotations of the preset."""
    if size.is_whole:
        return whole_card(cluster)
    preset, gpu_type, queue = cluster.preset, cluster.gpu_type, cluster.queue
    memory = bytes_for(size, cluster.gpu_memory, percent_resource=bool(preset.vgpu_memory_percent))
    resources: dict[str, str] = {}
    annotations: dict[str, str] = {}
    labels: dict[str, str] = {}
    if preset.vgpu_count:
        resources[preset.vgpu_count] = "1"
    if memory is None:
        assert preset.vgpu_memory_percent is not None
        resources[preset.vgpu_memory_percent] = str(int(size.amount))
    elif preset.vgpu_memory:
        unit = GiB if preset.vgpu_memory_unit == "GiB" else MiB
        resources[preset.vgpu_memory] = str(math.ceil(memory / unit))
    elif preset.vgpu_memory_annotation:
        annotations[preset.vgpu_memory_annotation] = str(math.ceil(memory / MiB))
    else:
        raise ModeUnavailableError(f"resource preset {preset.name!r} has no way to ask for GPU memory")
    if cores is not None:
        if not preset.vgpu_cores:
            raise ModeUnavailableError(f"resource preset {preset.name!r} cannot limit GPU cores")
        resources[preset.vgpu_cores] = str(cores)
    if gpu_type and preset.gpu_type_annotation:
        annotations[preset.gpu_type_annotation] = gpu_type
    if queue and preset.queue_label:
        labels[preset.queue_label] = queue
    env = soft_caps(memory, cluster.gpu_memory)
    return PodRequest(resources, annotations, labels, preset.scheduler_name, env=env, memory=memory)


def mig_request(size: Size, cluster: ClusterFacts) -> PodRequest:
    """The smallest MIG profile the cluster advertises that holds the size."""
    if not cluster.mig_profiles and not size.is_whole:
        raise ModeUnavailableError(
            "mode 'mig' needs MIG profiles: no node advertises nvidia.com/mig-* resources "
            "(or set c.GPUShare.mig_profiles)"
        )
    profile, memory = smallest_mig_profile(size, cluster)
    return PodRequest({f"{cluster.preset.mig_prefix}{profile}": "1"}, memory=memory)


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


# What a kernel pod asks for, by mode (the mode objects answer for local kernels; this table is
# the device-plugin dialect of the same modes).
POD_REQUESTS: dict[str, Callable[[Size, int | None, ClusterFacts], PodRequest]] = {
    "exclusive": lambda size, cores, cluster: whole_card(cluster),
    "timeslice": timeslice_request,
    "mps": mps_request,
    "vgpu": vgpu_request,
    "mig": lambda size, cores, cluster: mig_request(size, cluster),
}
