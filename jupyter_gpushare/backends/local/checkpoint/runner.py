"""Running the checkpoint helper for the backend: one subprocess per suspend or resume.

The backend holds a :class:`Runner` and never asks which: :class:`HelperRunner` starts
``python -m jupyter_gpushare.backends.local.checkpoint`` (the real driver, or a simulated pool's), and
:class:`InProcessRunner` calls a driver object directly (tests, with a substituted driver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Protocol

from jupyter_gpushare.backends.local.checkpoint.driver import REMAP_API, CheckpointDriver, DriverError
from jupyter_gpushare.backends.local.checkpoint.flows import Result, resume_process, suspend_process

HELPER_TIMEOUT = 900.0  # seconds: moving tens of GiB between GPU and host takes a while
# What the helper must not inherit from a kernel: it must see every GPU to remap one onto another.
_KERNEL_ONLY = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)


class Runner(Protocol):
    def suspend(self, pid: int, lock_timeout_ms: int) -> Result: ...

    def resume(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> Result: ...

    def can_remap(self) -> bool:
        """Whether a restore can go onto another GPU than the one the state came from."""


class InProcessRunner:
    """The flows on a driver object in this process."""

    def __init__(self, driver: CheckpointDriver) -> None:
        self.driver = driver

    def suspend(self, pid: int, lock_timeout_ms: int) -> Result:
        return suspend_process(self.driver, pid, lock_timeout_ms)

    def resume(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> Result:
        return resume_process(self.driver, pid, gpu_pairs)

    def can_remap(self) -> bool:
        try:
            return self.driver.version() >= REMAP_API
        except DriverError:
            return False


class HelperRunner:
    """The helper program, with the real driver or (``simulated`` = a state directory) a
    simulated pool's."""

    def __init__(self, simulated: str | None = None, timeout: float = HELPER_TIMEOUT) -> None:
        self.simulated = simulated
        self.timeout = timeout
        self._remap: bool | None = None

    def _run(self, *arguments: str) -> dict[str, object]:
        command = [sys.executable, "-m", "jupyter_gpushare.backends.local.checkpoint", *arguments]
        if self.simulated:
            command += ["--simulated", self.simulated]
        env = {name: value for name, value in os.environ.items() if name not in _KERNEL_ONLY}
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return Result(False, reason=f"the checkpoint helper did not finish: {error}").as_json()
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return Result(
                False, reason=f"the checkpoint helper failed (exit {done.returncode}): {said}"
            ).as_json()
        return answer

    def _result(self, answer: dict[str, object]) -> Result:
        known = set(Result.__dataclass_fields__)
        return Result(**{name: value for name, value in answer.items() if name in known})  # type: ignore[arg-type]

    def suspend(self, pid: int, lock_timeout_ms: int) -> Result:
        return self._result(
            self._run("suspend", "--pid", str(pid), "--lock-timeout-ms", str(lock_timeout_ms))
        )

    def resume(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> Result:
        pairs = [argument for old, new in gpu_pairs for argument in ("--pair", f"{old}={new}")]
        return self._result(self._run("resume", "--pid", str(pid), *pairs))

    def can_remap(self) -> bool:
        if self._remap is None:
            version = self._run("version").get("version")
            self._remap = isinstance(version, int) and version >= REMAP_API
        return self._remap
