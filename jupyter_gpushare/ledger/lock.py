"""A file lock with a time limit, that keeps the kernel's first-come-first-served wake-ups.

The ledger's writers queue on ``flock`` before asking sqlite: the kernel wakes blocked waiters
in turn, where sqlite's own busy handler sleeps and retries and lets one process starve the
others. A blocking ``flock`` cannot be given a timeout, though, and a process that hangs while
holding the lock must not hang every server, CLI and kernel of the node with it. So an
uncontended lock is taken at once, and a contended one is waited for by a helper thread that
the caller stops waiting for after ``timeout`` seconds. An abandoned helper keeps the
descriptor: when it finally gets the lock it lets go at once and closes it.

Helpers are kept and reused: with several processes writing, nearly every write meets a held
lock, and starting a thread for each would cost more than the write itself.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
from typing import ClassVar

# A write holds the lock for a few hundred microseconds: a contended lock is tried again a few
# times over about a millisecond before a helper thread queues for it, which costs two thread
# hand-offs (measured: benchmarks/ledger_throughput.py).
_SHORT_WAITS = (0.0001, 0.0002, 0.0003, 0.0004)


class LockTimeout(Exception):
    """The lock was not free within the time limit; the descriptor now belongs to the waiter."""


def lock_exclusive(fd: int, timeout: float) -> None:
    """Take an exclusive ``flock`` on ``fd`` within ``timeout`` seconds or raise LockTimeout.

    After a LockTimeout the caller must neither use nor close ``fd`` again.
    """
    for pause in _SHORT_WAITS:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(pause)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    wait = _Wait(fd)
    _Helper.take().hand(wait)
    if not wait.settle(timeout):
        raise LockTimeout()


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


class _Wait:
    """One caller's wait for the lock on ``fd``, and how it ended.

    Plain locks, not events: a contended write pays for this twice (the caller and the helper),
    and a lock is the cheapest thing a thread can sleep on with a timeout.
    """

    __slots__ = ("abandoned", "acquired", "done", "fd", "mutex")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mutex = threading.Lock()  # guards acquired/abandoned
        self.done = threading.Lock()  # held until the helper is done with this wait
        self.done.acquire()
        self.acquired = False
        self.abandoned = False

    def settle(self, timeout: float) -> bool:
        """Whether the lock was taken within ``timeout``; if not, the wait is abandoned."""
        self.done.acquire(timeout=timeout)
        with self.mutex:
            if self.acquired:
                return True
            self.abandoned = True
            return False


class _Helper:
    """A daemon thread that takes contended locks for callers, one after another."""

    _idle: ClassVar[list[_Helper]] = []  # waiting for the next contended lock
    _idle_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def take(cls) -> _Helper:
        with cls._idle_lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    def __init__(self) -> None:
        self._waits: queue.SimpleQueue[_Wait] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="gpushare-ledger-lock", daemon=True).start()

    def hand(self, wait: _Wait) -> None:
        self._waits.put(wait)

    def _run(self) -> None:
        while True:
            wait = self._waits.get()
            try:
                fcntl.flock(wait.fd, fcntl.LOCK_EX)
                acquired = True
            except OSError:
                acquired = False
            with wait.mutex:
                if wait.abandoned and acquired:
                    fcntl.flock(wait.fd, fcntl.LOCK_UN)
                    os.close(wait.fd)
                wait.acquired = acquired and not wait.abandoned
            wait.done.release()
            with self._idle_lock:
                self._idle.append(self)


def _forget_helpers() -> None:
    # A forked child has none of its parent's threads: its helpers are new ones.
    _Helper._idle = []
    _Helper._idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers)
