"""Starts waiting in the queue, and whether anyone still waits for them (local backend).

A start that does not fit waits in the ledger's FIFO queue while its requester asks after it
every few seconds (``POST slices/{id}/place``). A waiting row is held by the process that asked,
so it goes when that process ends — but a process can live on and stop asking: a server whose
wait failed while the broker was away, a script that asked once. Such a row would hold up the
queue for everyone behind it with nobody to take the slice. The broker therefore remembers when
each waiting request was last asked after and drops one nobody asked after for ``lease``
seconds; a restarted broker counts from its own start, so every requester has that long to come
back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable


class WaitingLeases:
    """When each waiting request was last asked after (pure, apart from the clock)."""

    def __init__(self, lease: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease = lease
        self._clock = clock
        self._since = clock()  # a request not asked after since the broker started: from now
        self._asked: dict[str, float] = {}
        self._lock = threading.Lock()  # routes and housekeeping run in threads

    def asked(self, kernel_id: str) -> None:
        """The requester of ``kernel_id`` asked (or asked after) its place in the queue."""
        with self._lock:
            self._asked[kernel_id] = self._clock()

    def abandoned(self, waiting: Iterable[str]) -> list[str]:
        """Which of the requests ``waiting`` now nobody asked after for longer than the lease;
        forgets requests that wait no more."""
        now = self._clock()
        waiting = list(waiting)
        with self._lock:
            asked = {kernel_id: self._asked[kernel_id] for kernel_id in waiting if kernel_id in self._asked}
            self._asked = asked
        return [kernel_id for kernel_id in waiting if now - asked.get(kernel_id, self._since) > self.lease]


__all__ = ["WaitingLeases"]
