"""How a cluster names GPU sharing: a resource preset's names, and a DRA driver's. Pure data.

A device-plugin preset says which extended resources, annotations and labels a pod uses; a
Dynamic Resource Allocation preset carries :class:`DraNames` instead: the driver, device classes
and capacity names its ResourceClaims use. The presets themselves (NVIDIA's, HAMi's, Volcano's,
KAI's, Aliyun's and the DRA drivers') are the Kubernetes kind's
(``jupyter_gpushare.backends.kubernetes.objects.presets``); each mode reads the names it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DraNames:
    """What a DRA driver calls things (``resource.k8s.io/v1``), as its ResourceSlices publish them."""

    driver: str  # the driver's name, also the domain of its attributes and capacities in CEL
    device_class: str  # DeviceClass of whole (or shared) GPUs
    mig_device_class: str | None = None  # DeviceClass of MIG devices (None: the driver has none)
    memory_capacity: str = "memory"  # the capacity holding a device's memory (bytes)
    cores_capacity: str | None = None  # a consumable capacity of SM percent (HAMi's "cores")
    product_attribute: str = "productName"  # the attribute gpu_type is matched against
    mig_profile_attribute: str = "profile"  # a MIG device's profile attribute ("1g.10gb")
    # Opaque configuration in the dialect of NVIDIA's driver (GpuConfig: TimeSlicing / MPS).
    nvidia_sharing: bool = False
    config_api_version: str = "resource.nvidia.com/v1beta1"
    # Devices allow several claims at once, each consuming part of their capacity (KEP-5075):
    # always for HAMi-DRA; for NVIDIA's driver where the cluster turned it on.
    consumable_capacity: bool = False


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
    dra: DraNames | None = None  # set for the DRA presets: kernels ask through ResourceClaims


__all__ = ["DraNames", "ResourcePreset"]
