"""What a pool is made of: devices and MIG instances, as plain immutable values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Source = Literal["nvml", "simulated", "none"]


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance: allocated whole to one kernel."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    memory_total: int


@dataclass(frozen=True)
class Device:
    """A physical GPU as the allocator and the API see it."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int | None = None  # measured by NVML; None where unknown (simulated)
    utilization: int | None = None  # percent of SM time, None where unknown
    mig: tuple[MigInstance, ...] = ()

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)

    @property
    def label(self) -> str:
        """How messages name the device: ``GPU0``."""
        return f"GPU{self.index}"


@dataclass(frozen=True)
class Inventory:
    """The devices found on this node, where they came from, and why there are none."""

    devices: tuple[Device, ...]
    source: Source
    problem: str | None = None  # set when there are no devices: what is missing and the fix
    details: dict[str, str] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"
