"""The checkpoint driver of a simulated pool: the states the CUDA driver would report, no GPU.

A simulated pool has no driver to move GPU memory, just as it has no NVML to measure it: a
kernel's GPU state there is its declared usage, which the backend moves with the slice. What
this driver keeps is each process's CUDA state (running, locked, checkpointed) and the order of
the calls, refusing what the real driver refuses (a checkpoint of a process that is not locked,
a restore of one that is not checkpointed). It keeps that in one small file per process next to
the ledger, because each call comes from a helper process of its own, as on a real GPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from jupyter_gpushare.backends.local.checkpoint.driver import CUDA_ERROR_NOT_FOUND, DriverError, ProcessState
from jupyter_gpushare.backends.processes import same_process, started
from jupyter_gpushare.core.records import ProcessIdentity

SIMULATED_API = 13010  # it can restore onto another card of the same (simulated) chip

CUDA_ERROR_ILLEGAL_STATE = 401


class SimulatedDriver:
    """Process states in ``state_dir``; every call checks the transition the driver allows."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)

    def _file(self, pid: int) -> Path:
        return self.state_dir / f"{pid}.json"

    def _start(self, pid: int) -> float:
        start = started(pid)
        if start is None:
            raise DriverError(f"no process {pid}: CUDA_ERROR_NOT_FOUND", CUDA_ERROR_NOT_FOUND)
        return start

    def _read(self, pid: int) -> dict[str, object]:
        start = self._start(pid)
        try:
            saved = json.loads(self._file(pid).read_text())
        except (OSError, ValueError):
            return {"state": "running", "start": start}
        if not same_process(ProcessIdentity(pid, float(saved.get("start", 0))), ProcessIdentity(pid, start)):
            return {"state": "running", "start": start}  # a reused pid: a process of its own
        return dict(saved)

    def _move(self, pid: int, expected: ProcessState, then: ProcessState, **extra: object) -> None:
        saved = self._read(pid)
        if saved["state"] != expected:
            raise DriverError(
                f"process {pid} is {saved['state']}, not {expected}: CUDA_ERROR_ILLEGAL_STATE",
                CUDA_ERROR_ILLEGAL_STATE,
            )
        saved.update(state=then, **extra)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = self._file(pid).with_suffix(".tmp")
        temporary.write_text(json.dumps(saved))
        temporary.replace(self._file(pid))

    def version(self) -> int:
        return SIMULATED_API

    def state(self, pid: int) -> ProcessState:
        return self._read(pid)["state"]  # type: ignore[return-value]

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move(pid, "running", "locked")

    def checkpoint(self, pid: int) -> None:
        self._move(pid, "locked", "checkpointed")

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._move(pid, "checkpointed", "locked", restored_onto=[list(pair) for pair in gpu_pairs])

    def unlock(self, pid: int) -> None:
        self._move(pid, "locked", "running")
