"""A fake CUDA driver checkpoint edge: what ``cuCheckpointProcess*`` answer, with no GPU.

The driver's checkpoint calls are the one edge of suspend/resume we do not own, so tests replace
them, as ``nvml_fake`` replaces NVML: the backend gets ``InProcessRunner(FakeCheckpointDriver())``
and everything else — the flows, the backend, the ledger — runs as it does on a GPU. The fake
keeps each pid's CUDA state and refuses what the driver refuses (checkpointing a process that is
not locked, restoring one that is not checkpointed). A test can make a call fail (``fail``),
hold a call until it says so (``hold``), or offer an older driver (``version``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from jupyter_gpushare.backends.local.checkpoint.driver import DriverError, NotSupported, ProcessState

CUDA_ERROR_ILLEGAL_STATE = 401


@dataclass
class Failure:
    """Make the next call of one kind fail: the error it raises and the state it leaves."""

    error: DriverError
    leaves: ProcessState | None = None  # the process's state after the failure (None: unchanged)


@dataclass
class FakeCheckpointDriver:
    api: int = 12080  # cuDriverGetVersion(): 12080 is CUDA 12.8, the first with checkpointing
    states: dict[int, ProcessState] = field(default_factory=dict)
    calls: list[tuple[str, int, tuple[tuple[str, str], ...]]] = field(default_factory=list)
    fail: dict[str, Failure] = field(default_factory=dict)
    hold: dict[str, threading.Event] = field(default_factory=dict)  # the call waits for the event
    entered: dict[str, threading.Event] = field(default_factory=dict)  # set when the call starts

    def version(self) -> int:
        return self.api

    def _enter(self, name: str, pid: int, pairs: Sequence[tuple[str, str]] = ()) -> None:
        self.calls.append((name, pid, tuple(pairs)))
        self.entered.setdefault(name, threading.Event()).set()
        if name in self.hold:
            assert self.hold[name].wait(30), f"{name} was held for 30 s"
        failure = self.fail.pop(name, None)
        if failure is not None:
            if failure.leaves is not None:
                self.states[pid] = failure.leaves
            raise failure.error

    def _move(self, pid: int, expected: ProcessState, then: ProcessState) -> None:
        now = self.states.get(pid, "running")
        if now != expected:
            raise DriverError(f"CUDA_ERROR_ILLEGAL_STATE ({now})", CUDA_ERROR_ILLEGAL_STATE)
        self.states[pid] = then

    def state(self, pid: int) -> ProcessState:
        self._enter("state", pid)
        return self.states.get(pid, "running")

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._enter("lock", pid)
        self._move(pid, "running", "locked")

    def checkpoint(self, pid: int) -> None:
        self._enter("checkpoint", pid)
        self._move(pid, "locked", "checkpointed")

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._enter("restore", pid, gpu_pairs)
        if gpu_pairs and self.api < 13010:
            raise NotSupported("CUcheckpointRestoreArgs has no GPU pairs before CUDA 13.1")
        self._move(pid, "checkpointed", "locked")

    def unlock(self, pid: int) -> None:
        self._enter("unlock", pid)
        self._move(pid, "locked", "running")

    def named(self, name: str) -> list[tuple[str, int, tuple[tuple[str, str], ...]]]:
        return [call for call in self.calls if call[0] == name]
