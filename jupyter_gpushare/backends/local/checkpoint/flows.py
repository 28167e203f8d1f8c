"""Suspend and resume one process with the driver's checkpoint calls, saying what went wrong.

Run by the helper process (``python -m jupyter_gpushare.backends.local.checkpoint``), never inside the kernel
it acts on. A suspend ends with the process *checkpointed*: every allocation and its CUDA context
in host memory, the GPU holding nothing of it, and its CUDA calls blocked until a resume. A
resume restores (onto another GPU of the same chip when pairs are given) and unlocks. A failure
leaves the process as the driver left it and says so: after a failed checkpoint it runs on as
before (it is unlocked again); a process the driver reports ``failed`` has lost its GPU state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from jupyter_gpushare.backends.local.checkpoint.driver import (
    CUDA_ERROR_TIMEOUT,
    CheckpointDriver,
    DriverError,
    NotSupported,
    require,
)


@dataclass(frozen=True)
class Result:
    """What a suspend or resume did; ``reason`` says why not when ``ok`` is False."""

    ok: bool
    state: str = ""  # the process's CUDA state afterwards, as the driver reports it
    seconds: float = 0.0
    reason: str = ""
    unsupported: bool = False  # the driver cannot do it at all (version, no library, refused)
    lost: bool = False  # the driver reports the process failed: its GPU state is gone

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def _state_or(driver: CheckpointDriver, pid: int, fallback: str) -> str:
    try:
        return driver.state(pid)
    except DriverError:
        return fallback


def suspend_process(driver: CheckpointDriver, pid: int, lock_timeout_ms: int) -> Result:
    """Lock (waiting up to ``lock_timeout_ms`` for submitted GPU work), checkpoint, and check
    that the driver reports the process checkpointed."""
    started = time.monotonic()
    try:
        require(driver)
        state = driver.state(pid)
    except NotSupported as error:
        return Result(False, reason=str(error), unsupported=True)
    except DriverError as error:
        return Result(False, reason=f"the CUDA driver knows no GPU state of process {pid} ({error})")
    if state != "running":
        return Result(False, state, reason=f"its CUDA state is {state}, not running")
    try:
        driver.lock(pid, lock_timeout_ms)
    except DriverError as error:
        if error.code == CUDA_ERROR_TIMEOUT:
            reason = (
                f"its GPU work did not finish within {lock_timeout_ms / 1000:g} s; suspend it "
                "when no cell is running"
            )
        else:
            reason = f"the CUDA driver could not lock it ({error})"
        return Result(
            False,
            _state_or(driver, pid, "running"),
            reason=reason,
            unsupported=isinstance(error, NotSupported),
        )
    try:
        driver.checkpoint(pid)
    except DriverError as checkpoint_error:
        with contextlib.suppress(DriverError):
            driver.unlock(pid)
        after = _state_or(driver, pid, "unknown")
        fate = "it runs on as before" if after == "running" else f"its CUDA state is now {after}"
        return Result(
            False,
            after,
            reason=f"the CUDA driver could not checkpoint it ({checkpoint_error}); {fate}",
            unsupported=isinstance(checkpoint_error, NotSupported),
            lost=after == "failed",
        )
    after = _state_or(driver, pid, "unknown")
    if after != "checkpointed":
        return Result(False, after, reason=f"after the checkpoint the driver reports it {after}")
    return Result(True, after, seconds=time.monotonic() - started)


def resume_process(driver: CheckpointDriver, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> Result:
    """Restore (remapped by ``gpu_pairs``) and unlock; a process already running (resumed by
    another caller) is left alone and counts as resumed."""
    started = time.monotonic()
    try:
        require(driver, remap=bool(gpu_pairs))
        state = driver.state(pid)
    except NotSupported as error:
        return Result(False, reason=str(error), unsupported=True)
    except DriverError as error:
        return Result(False, reason=f"the CUDA driver cannot read process {pid} ({error})")
    try:
        if state == "checkpointed":
            driver.restore(pid, gpu_pairs)
            state = "locked"
        if state == "locked":
            driver.unlock(pid)
    except DriverError as error:
        after = _state_or(driver, pid, "unknown")
        return Result(
            False,
            after,
            reason=f"the CUDA driver could not restore it ({error}); its CUDA state is {after}",
            unsupported=isinstance(error, NotSupported),
            lost=after == "failed",
        )
    after = _state_or(driver, pid, "unknown")
    if after != "running":
        return Result(
            False, after, reason=f"after the restore the driver reports it {after}", lost=after == "failed"
        )
    return Result(True, after, seconds=time.monotonic() - started)
