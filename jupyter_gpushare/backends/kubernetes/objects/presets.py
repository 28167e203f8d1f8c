"""How clusters name GPU sharing: one preset per device plugin, scheduler or DRA driver. Pure data.

A device-plugin preset says which extended resources, annotations and labels a pod uses for each
mode. The defaults are the NVIDIA device plugin's and HAMi's; Volcano vGPU, KAI and Aliyun's cGPU
are presets too, and any name can be overridden with ``c.GPUShare.resource_names``.

A Dynamic Resource Allocation preset (``nvidia-dra``, ``hami-dra``, the generic ``dra``) carries
:class:`~jupyter_gpushare.core.pods.presets.DraNames` instead: the driver, device classes and
capacity names its ResourceClaims use (:mod:`.claims` builds them); the ``dra_*`` traits override
them. What a preset is (its fields) is the pure core's, where each mode reads the names it needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset

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
    # Dynamic Resource Allocation (resource.k8s.io/v1): NVIDIA's DRA driver for GPUs (full GPUs,
    # MIG devices, GpuConfig sharing), HAMi's DRA driver on HAMi-core (memory and cores as
    # consumable capacity), and a driver whose names come from the dra_* traits.
    "nvidia-dra": ResourcePreset(
        "nvidia-dra",
        dra=DraNames(
            driver="gpu.nvidia.com",
            device_class="gpu.nvidia.com",
            mig_device_class="mig.nvidia.com",
            nvidia_sharing=True,
        ),
    ),
    "hami-dra": ResourcePreset(
        "hami-dra",
        dra=DraNames(
            driver="hami-core-gpu.project-hami.io",
            device_class="hami-core-gpu.project-hami.io",
            cores_capacity="cores",
            consumable_capacity=True,
        ),
    ),
    "dra": ResourcePreset("dra", dra=DraNames(driver="", device_class="")),
}

DRA_PRESETS = tuple(name for name, preset in PRESETS.items() if preset.dra is not None)
DEVICE_PLUGIN_PRESETS = tuple(name for name, preset in PRESETS.items() if preset.dra is None)


class PresetError(ValueError):
    """An unknown preset or an override of a field that does not exist."""


def resolve_preset(
    name: str,
    overrides: Mapping[str, object] | None = None,
    dra_overrides: Mapping[str, object] | None = None,
) -> ResourcePreset:
    """``PRESETS[name]`` with ``overrides`` (``c.GPUShare.resource_names``) applied, and for a
    DRA preset ``dra_overrides`` (the ``dra_*`` traits that are set: field -> value)."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown resource preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
    if preset.dra is not None and dra_overrides:
        known = {field.name for field in dataclasses.fields(DraNames)}
        unknown = set(dra_overrides) - known
        if unknown:
            raise PresetError(f"unknown DRA name field(s) {', '.join(sorted(unknown))}")
        preset = dataclasses.replace(preset, dra=dataclasses.replace(preset.dra, **dra_overrides))  # type: ignore[arg-type]
    if not overrides:
        return preset
    fields = {field.name for field in dataclasses.fields(ResourcePreset)} - {"name"}
    unknown = set(overrides) - fields
    if unknown:
        raise PresetError(
            f"unknown resource name field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(fields))}"
        )
    return dataclasses.replace(preset, **overrides)  # type: ignore[arg-type]
