"""The slice records the node ledger keeps, and the outcomes of asking it (pure values).

Apart from the sqlite code in :mod:`jupyter_gpushare.ledger` so that views, the kernel side and
the usage monitor can speak of slices without importing a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .allocator import Held, PlacementKind


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as the ledger knows it: pid and start time, so a reused pid is not it."""

    pid: int
    start: float  # seconds since the epoch, as psutil reports the process's creation


@dataclass(frozen=True)
class SliceRecord:
    """One row of the ledger."""

    kernel_id: str
    seq: int
    state: Literal["queued", "running"]
    owner: str
    server_id: str
    kernel_name: str
    path: str
    mode: str
    kind: PlacementKind
    size: str
    cores: int | None
    device_uuid: str | None
    unit_uuid: str | None
    memory: int
    whole_card: bool
    holder: ProcessIdentity
    kernel: ProcessIdentity | None
    requested_at: float
    placed_at: float | None
    token_hash: str | None = None
    memory_used: int | None = None  # bytes, as last sampled or reported
    utilization: int | None = None  # percent of the device's SM time, where known
    usage_source: str | None = None  # "nvml", "kernel" (the kernel's own report) or "simulated"
    usage_at: float | None = None
    warnings: tuple[str, ...] = ()

    @property
    def process(self) -> ProcessIdentity:
        """The process whose life the slice follows."""
        return self.kernel or self.holder

    def held(self) -> Held:
        assert self.device_uuid is not None and self.unit_uuid is not None
        return Held(
            self.kernel_id, self.owner, self.device_uuid, self.unit_uuid, self.memory, self.whole_card
        )


@dataclass(frozen=True)
class NewRequest:
    """What a caller asks the ledger to queue."""

    kernel_id: str
    owner: str
    server_id: str
    mode: str
    kind: PlacementKind
    size: str
    cores: int | None
    holder: ProcessIdentity
    kernel_name: str = ""
    path: str = ""
    token_hash: str | None = None


@dataclass(frozen=True)
class ReleasedSlice:
    """What a running kernel left in the ledger when it gave its slice back: its token digest
    (only it may take a slice under its id again), its name and path (they come back with it)
    and its process (the claim ends with it)."""

    kernel_id: str
    token_hash: str | None
    kernel_name: str
    path: str
    process: ProcessIdentity


@dataclass(frozen=True)
class KernelSample:
    """One kernel's usage in a sampling round, with the warnings it should see."""

    kernel_id: str
    memory_used: int | None
    utilization: int | None
    source: str | None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceSample:
    uuid: str
    memory_used: int | None
    utilization: int | None


@dataclass(frozen=True)
class Placed:
    record: SliceRecord


@dataclass(frozen=True)
class Waiting:
    position: int  # 1 = next in line
    reason: str


@dataclass(frozen=True)
class Refused:
    reason: str
    timed_out: bool = False  # waited ``queue_timeout`` seconds in the queue


Outcome = Placed | Waiting | Refused


@dataclass(frozen=True)
class UsageReport:
    """A kernel's GPU use as reported by the kernel itself, or by a cluster's metrics."""

    memory_used: int  # bytes
    utilization: int | None  # percent of the device's SM time, where known
    source: str  # "kernel" (measured inside it), "simulated" (declared) or "hami" (metrics)
