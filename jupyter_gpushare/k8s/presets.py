"""How clusters name GPU sharing: one preset per device plugin or scheduler. Pure data.

A preset says which extended resources, annotations and labels a pod uses for each mode. The
defaults are the NVIDIA device plugin's and HAMi's; Volcano vGPU, KAI and Aliyun's cGPU are
presets too, and any name can be overridden with ``c.GPUShare.resource_names``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ResourcePreset:
    name: str
    gpu: str = "nvidia.com/gpu"  # whole cards (exclusive)
    timeslice_gpu: str = "nvidia.com/gpu"  # a time-sliced replica (may be renamed nvidia.com/gpu.shared)
    mps_gpu: str = "nvidia.com/gpu"  # an MPS-shared replica
    vgpu_count: str | None = "nvidia.com/gpu"  # vgpu: number of virtual GPUs (None: not a resource)
    vgpu_memory: str | None = "nvidia.com/gpumem"  # vgpu: memory resource
    vgpu_memory_unit: Literal["MiB", "GiB"] = "MiB"
    vgpu_memory_percent: str | None = "nvidia.com/gpumem-percentage"  # for "25%" sizes
    vgpu_cores: str | None = "nvidia.com/gpucores"
    vgpu_memory_annotation: str | None = None  # an annotation instead of a resource (KAI)
    gpu_type_annotation: str | None = "nvidia.com/use-gputype"
    queue_label: str | None = None  # KAI's queue label
    mig_prefix: str = "nvidia.com/mig-"  # nvidia.com/mig-1g.10gb
    scheduler_name: str | None = None  # a scheduler the vgpu mode needs (hami-scheduler…)


PRESETS: Mapping[str, ResourcePreset] = {
    "nvidia": ResourcePreset("nvidia"),
    "hami": ResourcePreset("hami", scheduler_name="hami-scheduler"),
    "volcano": ResourcePreset(
        "volcano",
        vgpu_count="volcano.sh/vgpu-number",
        vgpu_memory="volcano.sh/vgpu-memory",
        vgpu_memory_percent=None,
        vgpu_cores="volcano.sh/vgpu-cores",
        gpu_type_annotation=None,
        scheduler_name="volcano",
    ),
    "kai": ResourcePreset(
        "kai",
        vgpu_count=None,
        vgpu_memory=None,
        vgpu_memory_percent=None,
        vgpu_cores=None,
        vgpu_memory_annotation="gpu-memory",
        gpu_type_annotation=None,
        queue_label="kai.scheduler/queue",
        scheduler_name="kai-scheduler",
    ),
    "aliyun": ResourcePreset(
        "aliyun",
        vgpu_count=None,
        vgpu_memory="aliyun.com/gpu-mem",
        vgpu_memory_unit="GiB",
        vgpu_memory_percent=None,
        vgpu_cores=None,
        gpu_type_annotation=None,
    ),
}


class PresetError(ValueError):
    """An unknown preset or an override of a field that does not exist."""


def resolve_preset(name: str, overrides: Mapping[str, object] | None = None) -> ResourcePreset:
    """``PRESETS[name]`` with ``overrides`` (``c.GPUShare.resource_names``) applied."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown resource preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
    if not overrides:
        return preset
    fields = {field.name for field in dataclasses.fields(ResourcePreset)} - {"name"}
    unknown = set(overrides) - fields
    if unknown:
        raise PresetError(
            f"unknown resource name field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(fields))}"
        )
    return dataclasses.replace(preset, **overrides)  # type: ignore[arg-type]
