"""HAMi-core style virtualisation: ``libvgpu.so`` intercepts CUDA and enforces the slice."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from jupyter_gpushare.core.errors import ModeUnavailableError
from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps, mib_limit
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs, counts_virtual_gpus
from jupyter_gpushare.core.pods.dra import Alternative, dra_names, shared_alternative
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import (
    TYPED_VALUE,
    PodRequest,
    TemplatedRequest,
    bytes_for,
    soft_caps,
    whole_card,
)
from jupyter_gpushare.core.sizes import GiB, MiB, Size


class VGPUMode(Mode):
    name = "vgpu"
    enforcement = "hard: HAMi-core interception (libvgpu.so)"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        if facts.simulated or facts.libvgpu_path:
            return None
        return (
            "mode 'vgpu' needs HAMi-core's libvgpu.so: build or install it and set "
            "c.GPUShare.libvgpu_path to the file"
        )

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        env = framework_caps(grant)
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{mib_limit(grant)}m"
        # HAMi-core keeps per-process accounting in a shared file; one per kernel keeps them apart.
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(
            facts.vgpu_cache_directory, f"gpushare-vgpu-{grant.kernel_id}.cache"
        )
        if grant.cores is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(grant.cores)
        if facts.libvgpu_path:
            env["LD_PRELOAD"] = facts.libvgpu_path
        return env

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
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
        scheduler = self.scheduler_name(preset)
        return PodRequest(resources, annotations, labels, scheduler, env=env, memory=memory)

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        """Memory and cores as consumable capacity, enforced by the driver (HAMi-core)."""
        names = dra_names(cluster)
        if names.nvidia_sharing:
            raise ModeUnavailableError(
                f"resource preset {cluster.preset.name!r} (NVIDIA's DRA driver) has no vgpu: it does "
                "not enforce memory slices by interception. Use mode 'mps' (a pinned memory limit per "
                "kernel) or resource preset 'hami-dra'"
            )
        if not names.consumable_capacity:
            raise ModeUnavailableError(
                "mode 'vgpu' needs a DRA driver whose GPUs take several claims, each consuming part "
                "of their memory (consumable capacity): resource preset 'hami-dra', or set "
                "c.GPUShare.dra_consumable_capacity = True where the driver offers it"
            )
        extra: dict[str, str] = {}
        if cores is not None:
            if not names.cores_capacity:
                raise ModeUnavailableError(
                    f"resource preset {cluster.preset.name!r} cannot limit GPU cores: set "
                    "c.GPUShare.dra_cores_capacity to the driver's capacity of SM percent"
                )
            extra[names.cores_capacity] = str(cores)
        return shared_alternative(self.name, size, cluster, None, extra_capacity=extra)

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        # Virtual GPUs (HAMi, Volcano), or memory as an annotation on whole cards (KAI).
        advertised = node.allocatable
        annotated = bool(preset.vgpu_memory_annotation) and preset.gpu in advertised
        return counts_virtual_gpus(preset, advertised) or annotated

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        # Slices need devices that take several claims, and a driver that enforces them.
        cards = [device for device in devices if not device.is_mig]
        consumable = names.consumable_capacity or any(device.shared for device in cards)
        return bool(cards) and consumable and not names.nvidia_sharing

    def scheduler_name(self, preset: ResourcePreset) -> str | None:
        return preset.scheduler_name

    def templated_request(self, preset: ResourcePreset, cores: int | None) -> TemplatedRequest:
        resources: dict[str, str] = {}
        annotations: dict[str, str] = {}
        if preset.vgpu_count:
            resources[preset.vgpu_count] = "1"
        if preset.vgpu_memory:
            resources[preset.vgpu_memory] = TYPED_VALUE
        elif preset.vgpu_memory_annotation:
            annotations[preset.vgpu_memory_annotation] = TYPED_VALUE
        if cores is not None and preset.vgpu_cores:
            resources[preset.vgpu_cores] = str(cores)
        request = PodRequest(resources, annotations, scheduler_name=self.scheduler_name(preset))
        return TemplatedRequest(preset.vgpu_memory_unit, request)
