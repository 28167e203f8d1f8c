"""The slice records the node ledger keeps, and the outcomes of asking it (pure values).

Apart from the sqlite code in :mod:`jupyter_gpushare.backends.local.ledger` so that views, the kernel side and
the usage monitor can speak of slices without importing a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.placement.allocator import Held, Placement


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as the ledger knows it: pid and start time, so a reused pid is not it."""

    pid: int
    start: float  # seconds after boot that it started (processes.started): no clock change moves it


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
    placement: Placement
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

    @property
    def reserved(self) -> int:
        """Bytes placement counts for this running slice: the slice, or what its processes were
        last measured to hold when that is more (the ledger never offers memory a live process
        holds)."""
        return max(self.memory, self.memory_used or 0)

    @property
    def held_beyond(self) -> int:
        """What the kernel's processes hold when it is more than the slice (else 0)."""
        used = self.memory_used or 0
        return used if used > self.memory else 0

    def held(self) -> Held:
        assert self.device_uuid is not None and self.unit_uuid is not None
        return Held(
            self.kernel_id, self.owner, self.device_uuid, self.unit_uuid, self.reserved, self.whole_card
        )


@dataclass(frozen=True)
class NewRequest:
    """What a caller asks the ledger to queue."""

    kernel_id: str
    owner: str
    server_id: str
    mode: str
    placement: Placement
    size: str
    cores: int | None
    holder: ProcessIdentity
    kernel_name: str = ""
    path: str = ""
    token_hash: str | None = None
    # Where the slice may be placed (device UUIDs), None for anywhere: a resume onto a card of
    # the chip its GPU state came from, or a kernel taking a slice where it still holds memory.
    only_devices: tuple[str, ...] | None = None


# The ledger's name for a slice's placement (its ``slices`` column, a suspended state's JSON key):
# kept from before the field was renamed, as renaming a column would need a migration.
STORED_PLACEMENT = "kind"


@dataclass(frozen=True)
class SuspendedState:
    """What a suspended kernel needs to come back: the slice it had and where its GPU state
    came from (a restore can only go onto a card of the same chip)."""

    size: str  # canonical size of the slice it had
    mode: str
    placement: Placement
    cores: int | None
    memory: int  # bytes of the slice it had
    device_uuid: str
    device_name: str  # the chip, e.g. "NVIDIA H100 80GB HBM3"
    state_bytes: int  # GPU memory moved to host memory (0: it held none, nothing was checkpointed)
    suspended_at: float
    holder: ProcessIdentity  # the process that held the slice (it gets it back)
    checkpointed: bool = True  # the driver checkpointed the process (False when it held nothing)

    def as_json(self) -> dict[str, object]:
        values = dict(self.__dict__)
        values["holder"] = [self.holder.pid, self.holder.start]
        # Stored in the ledger under its first name, so that existing ledgers read the same.
        values[STORED_PLACEMENT] = values.pop("placement")
        return values

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> SuspendedState:
        fields = dict(values)
        pid, start = fields.pop("holder")
        fields["placement"] = fields.pop(STORED_PLACEMENT)
        return cls(holder=ProcessIdentity(int(pid), float(start)), **fields)


@dataclass(frozen=True)
class ReleasedSlice:
    """What a running kernel left in the ledger when it gave its slice back: its token digest
    (only it may take a slice under its id again), its name and path (they come back with it)
    and its process (the claim ends with it).

    ``held``: bytes its processes still hold on ``device_uuid`` (a CUDA context, tensors not
    freed), which placement keeps reserved until they are freed or the process ends.
    ``suspended``: set while its GPU state is checkpointed to host memory.
    ``attached``: whether ``process`` is the kernel's own process (it was attached when the
    slice was given back), not the process that asked for the slice on its behalf.
    """

    kernel_id: str
    token_hash: str | None
    kernel_name: str
    path: str
    process: ProcessIdentity
    owner: str = ""
    device_uuid: str | None = None
    unit_uuid: str | None = None
    held: int = 0
    held_source: str | None = None
    suspended: SuspendedState | None = None
    attached: bool = True


@dataclass(frozen=True)
class LedgerState:
    """The whole ledger as one read transaction saw it: what the views and the sampler read.

    Shared by every reader of the process until the next commit (see ``Ledger.state``), so it
    is never changed: tuples of frozen records.
    """

    devices: tuple[Device, ...]  # as registered, with the usage last sampled
    slices: tuple[SliceRecord, ...]  # queued and running, in queue order (seq)
    released: tuple[ReleasedSlice, ...]  # kernels running without a slice, oldest first
    simulated: bool


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


# The outcome of asking the ledger for a slice: placed, waiting in the queue, or refused for good.
# (The allocator's verdict on one try is a Spot or a NoFit: a NoFit that waiting could change
# becomes Waiting, any other becomes Refused.)


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
    # "kernel" (measured inside it: NVML where a pod holds whole cards, else PyTorch),
    # "simulated" (declared) or "hami" (metrics)
    source: str


@dataclass(frozen=True)
class Holding:
    """What a kernel's processes hold on the GPU now."""

    memory: int  # bytes
    source: str | None  # "nvml", "simulated", "kernel"; None when nothing could be measured
    gpu_pids: tuple[int, ...] = ()  # the kernel's processes NVML lists (empty without NVML)


@dataclass(frozen=True)
class Suspension:
    """A suspend that happened: the slice given back and what came to host memory."""

    record: SliceRecord
    state: SuspendedState
    seconds: float
    device: Device
    held_after: Holding  # what the kernel's processes still hold (0 unless NVML says otherwise)


@dataclass(frozen=True)
class Resumption:
    """A resume that happened: the new slice, where, and how long the restore took."""

    record: SliceRecord
    state: SuspendedState
    seconds: float
    device: Device
