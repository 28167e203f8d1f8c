"""A fake ``pynvml`` module: NVML is the one edge of the package we do not own.

It is installed through the ``_nvml()`` seam of ``jupyter_gpushare.inventory.nvml``.
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
class FakeBoard:
    uuid: str
    name: str
    memory_total: int
    memory_used: int = 0
    utilization: int | None = 0  # None: NVML answers NotSupported
    mig: Sequence[FakeMig | None] | None = None  # None: board without MIG; None entries: empty slots
    as_bytes: bool = False  # older bindings return bytes for names and UUIDs


@dataclass
class FakeNVMLState:
    init_calls: int = 0
    shutdown_calls: int = 0
    calls: list[str] = field(default_factory=list)


def make_fake_pynvml(
    boards: Sequence[FakeBoard],
    *,
    init_error: str | None = None,
    count_error: str | None = None,
    driver: str = "550.54.15",
) -> tuple[Any, FakeNVMLState]:
    """A module-like object with the pynvml calls the inventory uses."""
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

    def nvmlDeviceGetMemoryInfo(handle: Any) -> Any:
        kind, item = handle
        if kind == "board":
            return SimpleNamespace(total=item.memory_total, used=item.memory_used, free=0)
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

    module = SimpleNamespace(
        NVMLError=FakeNVMLError,
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
    )
    return module, state
