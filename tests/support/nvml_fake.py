"""A fake ``pynvml`` module: NVML is the one edge of the package we do not own.

It is installed through the ``_nvml()`` seam of ``jupyter_gpushare.backends.local.inventory.nvml`` (and, for
usage sampling, of ``jupyter_gpushare.backends.local.usage.nvml_usage``, which imported that name). Boards are
mutable: a test changes a board's ``processes``, ``process_utilization``, ``memory_used`` or
``utilization`` between two samples and the next NVML call sees the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class FakeNVMLError(Exception):
    """Stands for ``pynvml.NVMLError``."""


@dataclass
class FakeMig:
    uuid: str
    name: str  # as NVML names a MIG device, e.g. "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    memory_total: int


@dataclass
class FakeProcess:
    """One entry of ``nvmlDeviceGetComputeRunningProcesses``, named as pynvml names it."""

    pid: int
    usedGpuMemory: int | None  # pynvml's name; None where the driver hides it


@dataclass
class FakeProcessUtilization:
    """One sample of ``nvmlDeviceGetProcessUtilization``, named as pynvml names it."""

    pid: int
    smUtil: int  # pynvml's name
    memUtil: int = 0
    timeStamp: int = 1  # microseconds; NVML returns the samples newer than the timestamp asked


@dataclass
class FakeBoard:
    uuid: str
    name: str
    memory_total: int
    memory_used: int = 0
    utilization: int | None = 0  # None: NVML answers NotSupported
    mig: Sequence[FakeMig | None] | None = None  # None: board without MIG; None entries: empty slots
    as_bytes: bool = False  # older bindings return bytes for names and UUIDs
    processes: list[FakeProcess] = field(default_factory=list)  # compute processes on the board
    # What the driver and firmware reserve, reported apart by version 2 of the memory call; None:
    # a driver without version 2 (it answers FunctionNotFound), whose first version counts it used.
    memory_reserved: int | None = None
    # Per-process SM samples; None: NVML answers NotSupported. An empty list also raises (NVML
    # has no sample to give), as the real binding does when no process ran recently.
    process_utilization: list[FakeProcessUtilization] | None = field(default_factory=list)


@dataclass
class FakeNVMLState:
    init_calls: int = 0
    shutdown_calls: int = 0
    calls: list[str] = field(default_factory=list)  # usage calls, e.g. "GetHandleByUUID(GPU-a)"


def make_fake_pynvml(
    boards: Sequence[FakeBoard],
    *,
    init_error: str | None = None,
    count_error: str | None = None,
    driver: str = "550.54.15",
) -> tuple[Any, FakeNVMLState]:
    """A module-like object with the pynvml calls the inventory and the usage sampler use."""
    state = FakeNVMLState()

    def text(board: FakeBoard, value: str) -> str | bytes:
        return value.encode() if board.as_bytes else value

    def nvmlInit() -> None:
        state.init_calls += 1
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def nvmlShutdown() -> None:
        state.shutdown_calls += 1

    def nvmlDeviceGetCount() -> int:
        if count_error is not None:
            raise FakeNVMLError(count_error)
        return len(boards)

    def nvmlDeviceGetHandleByIndex(index: int) -> Any:
        return ("board", boards[index])

    def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> Any:
        kind, item = handle
        if kind == "board":
            reserved = item.memory_reserved
            if version is not None:
                if reserved is None:
                    raise FakeNVMLError("Function Not Found")
                return SimpleNamespace(
                    total=item.memory_total, reserved=reserved, used=item.memory_used, free=0
                )
            return SimpleNamespace(total=item.memory_total, used=item.memory_used + (reserved or 0), free=0)
        return SimpleNamespace(total=item.memory_total, used=0, free=item.memory_total)

    def nvmlDeviceGetUtilizationRates(handle: Any) -> Any:
        _, board = handle
        if board.utilization is None:
            raise FakeNVMLError("Not Supported")
        return SimpleNamespace(gpu=board.utilization, memory=0)

    def nvmlDeviceGetUUID(handle: Any) -> Any:
        kind, item = handle
        return text(item, item.uuid) if kind == "board" else item.uuid

    def nvmlDeviceGetName(handle: Any) -> Any:
        kind, item = handle
        return text(item, item.name) if kind == "board" else item.name

    def nvmlDeviceGetMigMode(handle: Any) -> tuple[int, int]:
        _, board = handle
        if board.mig is None:
            raise FakeNVMLError("Not Supported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(handle: Any) -> int:
        _, board = handle
        return len(board.mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(handle: Any, slot: int) -> Any:
        _, board = handle
        instance = board.mig[slot]
        if instance is None:
            raise FakeNVMLError("Not Found")
        return ("mig", instance)

    def nvmlSystemGetDriverVersion() -> str:
        return driver

    def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Any:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        state.calls.append(f"GetHandleByUUID({wanted})")
        for board in boards:
            if board.uuid == wanted:
                return ("board", board)
            for instance in board.mig or ():
                if instance is not None and instance.uuid == wanted:
                    return ("mig", instance)
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:
        kind, item = handle
        state.calls.append(f"GetComputeRunningProcesses({item.uuid})")
        if kind != "board":
            return []
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.usedGpuMemory) for p in item.processes]

    def nvmlDeviceGetProcessUtilization(handle: Any, timestamp: int) -> list[Any]:
        kind, item = handle
        state.calls.append(f"GetProcessUtilization({item.uuid}, {timestamp})")
        if kind != "board" or item.process_utilization is None:
            raise FakeNVMLError("Not Supported")
        samples = [s for s in item.process_utilization if s.timeStamp > timestamp]
        if not samples:
            raise FakeNVMLError("Not Found")
        return [
            SimpleNamespace(pid=s.pid, smUtil=s.smUtil, memUtil=s.memUtil, timeStamp=s.timeStamp)
            for s in samples
        ]

    module = SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlMemory_v2=0x02000028,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_DEVICE_MIG_DISABLE=0,
        nvmlInit=nvmlInit,
        nvmlShutdown=nvmlShutdown,
        nvmlDeviceGetCount=nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex=nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetMemoryInfo=nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetUtilizationRates=nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetUUID=nvmlDeviceGetUUID,
        nvmlDeviceGetName=nvmlDeviceGetName,
        nvmlDeviceGetMigMode=nvmlDeviceGetMigMode,
        nvmlDeviceGetMaxMigDeviceCount=nvmlDeviceGetMaxMigDeviceCount,
        nvmlDeviceGetMigDeviceHandleByIndex=nvmlDeviceGetMigDeviceHandleByIndex,
        nvmlSystemGetDriverVersion=nvmlSystemGetDriverVersion,
        nvmlDeviceGetHandleByUUID=nvmlDeviceGetHandleByUUID,
        nvmlDeviceGetComputeRunningProcesses=nvmlDeviceGetComputeRunningProcesses,
        nvmlDeviceGetProcessUtilization=nvmlDeviceGetProcessUtilization,
    )
    return module, state
