"""The one abstraction every sharing mode implements (docs/how-it-works/modes.md table).

A mode answers every question about itself, so that adding one is a module and an entry point
(:mod:`.registry`) and no other code changes: whether a node can honour it and what a local
kernel's environment gets; on Kubernetes, what a kernel pod asks for in either dialect (device
plugins' resources, one alternative of a DRA claim), which nodes and devices offer it, and what
a JupyterHub profile needs of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.framework_budget import framework_budget
from jupyter_gpushare.core.placement.allocator import Placement
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.dra import Alternative
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import PodRequest, TemplatedRequest
from jupyter_gpushare.core.sizes import Size


@dataclass(frozen=True)
class NodeFacts:
    """What this node offers that modes depend on; gathered by ``probe_node`` (I/O)."""

    simulated: bool = False
    has_devices: bool = True
    mig_instances: int = 0
    mps_pipe_directory: str | None = None  # set only when an MPS control daemon answers there
    libvgpu_path: str | None = None  # set only when the configured file exists
    vgpu_cache_directory: str = "/tmp"


@dataclass(frozen=True)
class Grant:
    """A placed slice, as the kernel will see it."""

    kernel_id: str
    mode: str
    unit_uuid: str  # device UUID, or MIG instance UUID
    unit_memory: int  # bytes of the device or MIG instance
    memory: int  # bytes reserved
    cores: int | None = None  # % of SMs, where the mode can limit it


class Mode(ABC):
    """A way of sharing a GPU: who can honour it, what a local kernel's environment gets, what a
    kernel pod asks a cluster for and which of the cluster's nodes offer it."""

    name: ClassVar[str]  # its name in requests, settings and the entry-point group
    placement: ClassVar[Placement] = "shared"  # how the allocator places it on a node
    live_resize: ClassVar[bool] = False  # can a running kernel's cap change without a restart
    soft_limit: ClassVar[bool] = False  # nothing below us enforces the slice: the watchdog acts
    enforcement: ClassVar[str]  # a short phrase for docs, `status` and `GET modes`

    # ---- a local node --------------------------------------------------------------------------

    @abstractmethod
    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        """None when this node can honour the mode, else what is missing and how to fix it."""

    def kernel_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        """Environment for a local kernel holding ``grant``."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": grant.unit_uuid,
            env_names.KERNEL_ID: grant.kernel_id,
            env_names.MODE: grant.mode,
            env_names.DEVICE: grant.unit_uuid,
            env_names.MEMORY_BYTES: str(grant.memory),
        }
        if grant.cores is not None:
            env[env_names.CORES] = str(grant.cores)
        env.update(self.mode_env(grant, facts))
        return env

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        """What this mode adds to the common variables."""
        return {}

    # ---- a Kubernetes cluster ------------------------------------------------------------------

    @abstractmethod
    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        """What a kernel pod of ``size`` asks for under a device-plugin preset: its resources,
        annotations, labels and scheduler, and the caps its kernel gets; raises
        :class:`~jupyter_gpushare.core.errors.ModeUnavailableError` where the preset cannot ask."""

    @abstractmethod
    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        """What a kernel's ResourceClaim asks for under a DRA preset (alone, or as one entry of
        ``firstAvailable``); ``card_at_least`` is the memory a whole card must have where the
        request was an amount before it became a whole card. Raises
        :class:`~jupyter_gpushare.core.errors.ModeUnavailableError` where the driver cannot."""

    @abstractmethod
    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        """Whether a node's device-plugin resources and labels offer this mode."""

    @abstractmethod
    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        """Whether one node's devices of the preset's DRA driver serve claims in this mode."""

    def scheduler_name(self, preset: ResourcePreset) -> str | None:
        """The scheduler a pod in this mode needs under ``preset`` (None: the cluster's own)."""
        return None

    def templated_request(self, preset: ResourcePreset, cores: int | None) -> TemplatedRequest | None:
        """What a pod asks for an amount typed in later (a YAML profile list's custom size), or
        None where the mode takes no amount (a whole card, a MIG profile)."""
        return None


def framework_caps(grant: Grant) -> dict[str, str]:
    """Variables that hold JAX, CuPy and TensorFlow to the slice without any code in the kernel.

    JAX must not preallocate (its default takes 75% of the card) and gets its fraction; CuPy's
    pool reads its byte limit; TensorFlow grows instead of grabbing the card. PyTorch has no such
    variable: the kernel-side import hook caps it.
    """
    budget = framework_budget(grant.memory)  # the slice less the process's CUDA context
    # Round the fraction down so JAX never gets more than the reserved bytes.
    fraction = int(budget * 10_000 / grant.unit_memory) / 10_000
    return {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.4f}",
        "CUPY_GPU_MEMORY_LIMIT": str(budget),
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }


def mib_limit(grant: Grant) -> str:
    """A cap in MiB rounded down, so the library never allows more than was reserved."""
    return f"{grant.memory // (1024 * 1024)}"


__all__ = ["Grant", "Mode", "NodeFacts", "framework_caps", "mib_limit"]
