"""Kernel starts that ``POST kernels`` answered before they finished (queued ones)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FAILED_KEPT_FOR = 600.0  # seconds a failed start stays readable through GET kernels/{id}


class StartCancelledError(Exception):
    """Why a start that was withdrawn before its kernel ran did not finish."""


@dataclass
class Start:
    kernel_id: str
    kernel_name: str
    path: str
    task: asyncio.Task[str]
    error: BaseException | None = None  # why it failed, once it did
    ended_at: float | None = None
    detail: str | None = None  # what the start is doing ("pending: 0/4 nodes are available…")
    # When its client last asked after it (GET kernels/{id}): a queued start nobody asks after
    # any more (a closed browser tab) is withdrawn (server.lifecycle).
    asked_at: float = field(default_factory=time.monotonic)
    # Set on each report of the start's provisioner (a queue position, a pod's phase): what
    # ``POST kernels`` waits on, with the start itself, instead of asking the backend in a loop.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pending(self) -> bool:
        return not self.task.done()


@dataclass
class Starts:
    """Starts in flight, and failed ones for a while so a client can read why."""

    _starts: dict[str, Start] = field(default_factory=dict)

    def track(self, start: Start, on_failure: Callable[[str], None] | None = None) -> None:
        self._starts[start.kernel_id] = start
        start.task.add_done_callback(lambda task: self._ended(start, task, on_failure))

    def _ended(self, start: Start, task: asyncio.Task[str], on_failure: Callable[[str], None] | None) -> None:
        start.ended_at = time.monotonic()
        if task.cancelled() or task.exception() is not None:
            error = None if task.cancelled() else task.exception()
            start.error = error or StartCancelledError("the kernel start was cancelled")
            if on_failure is not None:
                on_failure(start.kernel_id)
        else:
            self._starts.pop(start.kernel_id, None)  # an ordinary kernel from now on

    def get(self, kernel_id: str) -> Start | None:
        self._forget_old()
        return self._starts.get(kernel_id)

    def asked(self, kernel_id: str) -> None:
        """Its client asked after the start: it still wants the kernel."""
        start = self._starts.get(kernel_id)
        if start is not None:
            start.asked_at = time.monotonic()

    def note(self, kernel_id: str, detail: str) -> None:
        start = self._starts.get(kernel_id)
        if start is not None:
            start.detail = detail
            start.changed.set()

    def forget(self, kernel_id: str) -> None:
        self._starts.pop(kernel_id, None)

    def pending(self) -> list[Start]:
        return [start for start in self._starts.values() if start.pending]

    def _forget_old(self) -> None:
        now = time.monotonic()
        for kernel_id, start in list(self._starts.items()):
            if start.ended_at is not None and now - start.ended_at > FAILED_KEPT_FOR:
                del self._starts[kernel_id]
