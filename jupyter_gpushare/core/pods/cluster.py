"""What a cluster offers, as the Kubernetes kind reads it: the facts pod requests depend on, one
node's GPUs (device plugins' resources and GPU Feature Discovery's labels), one device a DRA
driver publishes. Pure data; reading them from API objects is the kind's
(``backends/kubernetes/objects/pool.py`` and ``dra_pool.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jupyter_gpushare.core.pods.presets import ResourcePreset

MIG_TYPE = "mig"  # the "type" attribute of a DRA driver's MIG devices


@dataclass(frozen=True)
class ClusterFacts:
    """What the cluster offers that pod requests depend on."""

    preset: ResourcePreset
    mig_profiles: Sequence[str] = ()
    gpu_memory: int | None = None  # the cards' memory (GPU Feature Discovery), where known
    gpu_type: str | None = None
    queue: str | None = None
    fallbacks: Sequence[str] = ()  # DRA: modes a claim may fall back to (c.GPUShare.dra_fallbacks)


@dataclass(frozen=True)
class NodeGPUs:
    """What one node offers, read from its labels and allocatable resources."""

    name: str
    product: str | None
    card_memory: int | None  # bytes per card (GFD), where labelled
    cards: int | None  # physical cards, where known
    sharing: str | None  # GFD sharing strategy: none | time-slicing | mps
    replicas: int | None
    memory_total: int  # bytes the node offers to slices (0 when nothing says)
    allocatable: dict[str, str] = field(default_factory=dict)  # the GPU resources only
    mig: dict[str, int] = field(default_factory=dict)  # profile -> instances
    # Read from DRA objects (dra_pool.py): bytes every allocated ResourceClaim holds on the
    # node, whoever made it, and the modes its devices serve. None: a device-plugin node.
    claimed: int | None = None
    offered_modes: tuple[str, ...] | None = None

    @property
    def shares_cards(self) -> bool:
        """Whether the device plugin shares its cards (time-slicing or MPS replicas)."""
        return self.sharing not in (None, "none")


@dataclass(frozen=True)
class DraDevice:
    """One device of the preset's driver, as a ResourceSlice publishes it."""

    node: str
    pool: str
    name: str
    device_type: str  # the driver's "type" attribute: gpu, mig, hami-gpu…
    memory: int  # bytes of its memory capacity (0 when it publishes none)
    product: str | None = None
    uuid: str | None = None
    profile: str | None = None  # MIG devices
    shared: bool = False  # allowMultipleAllocations: several claims may hold parts of it

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.name

    @property
    def is_mig(self) -> bool:
        return self.device_type == MIG_TYPE or self.profile is not None


def counts_virtual_gpus(preset: ResourcePreset, allocatable: Mapping[str, str]) -> bool:
    """Whether a node's GPU count is of virtual GPUs (HAMi advertises several per card)."""
    return preset.vgpu_memory is not None and preset.vgpu_memory in allocatable


__all__ = ["MIG_TYPE", "ClusterFacts", "DraDevice", "NodeGPUs", "counts_virtual_gpus"]
