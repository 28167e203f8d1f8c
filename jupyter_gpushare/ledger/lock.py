"""A file lock with a time limit, that keeps the kernel's first-come-first-served wake-ups.

The ledger's writers queue on ``flock`` before asking sqlite: the kernel wakes blocked waiters
in turn, where sqlite's own busy handler sleeps and retries and lets one process starve the
others. A blocking ``flock`` cannot be given a timeout, though, and a process that hangs while
holding the lock must not hang every server, CLI and kernel of the node with it. So a free lock
is taken at once, and a contended one is waited for by a kept thread that the caller stops
waiting for after ``timeout`` seconds:

* a write transaction (:func:`run_in_writer`) runs whole in that thread, which holds the lock
  only while it runs: handing the lock back to a waiting caller kept it held while the caller
  waited for a CPU, a fifth of the throughput with four writing processes on two cores;
* the lock file's note (:func:`lock_exclusive`) is waited for by a helper that hands the lock to
  its caller; an abandoned helper lets go as soon as it gets the lock, and closes the descriptor.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

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


def try_lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` if it is free now, after a few short tries."""
    for pause in _SHORT_WAITS:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(pause)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def lock_blocking(fd: int) -> None:
    """Wait for the lock on ``fd`` however long it takes: only in a writer thread, whose
    caller's wait is bounded (:func:`run_in_writer`)."""
    fcntl.flock(fd, fcntl.LOCK_EX)


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


class Abandoned(Exception):
    """Raised in a writer thread that got the lock for a caller who stopped waiting."""


class _Job:
    """One transaction handed to a writer thread, and how it ended."""

    __slots__ = ("abandoned", "done", "error", "mutex", "result", "started", "work")

    def __init__(self, work: Callable[[Callable[[], bool]], Any]) -> None:
        self.work = work
        self.mutex = threading.Lock()  # guards started/abandoned
        self.done = threading.Lock()  # held until the writer is done with this job
        self.done.acquire()
        self.started = False
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None

    def claim(self) -> bool:
        """The writer has the lock: start the transaction, unless its caller stopped waiting."""
        with self.mutex:
            self.started = not self.abandoned
            return self.started

    def settle(self, timeout: float) -> bool:
        """Whether the transaction ran (waiting for its end once it started); False when it had
        not started within ``timeout``, and then it never will."""
        try:
            if self.done.acquire(timeout=timeout):
                return True
        except BaseException:  # interrupted while waiting: a transaction not yet begun never is
            with self.mutex:
                self.abandoned = not self.started
            raise
        with self.mutex:
            if not self.started:
                self.abandoned = True
                return False
        self.done.acquire()  # it holds the lock and runs: a write is short, see it through
        return True


def run_in_writer(work: Callable[[Callable[[], bool]], T], timeout: float) -> T:
    """Run ``work(claim)`` in a writer thread and return what it returns (or raise what it raised).

    ``work`` waits for the lock itself, then calls ``claim()`` and stops (raising
    :class:`Abandoned`) if it answers False. The writer holding the lock is the thread that runs
    the transaction, so the lock is never held by a thread waiting for a CPU to wake it (with
    four writing processes on two cores that wait cost a fifth of the throughput). Raises
    LockTimeout when the transaction had not started within ``timeout``.
    """
    job = _Job(work)
    _Writer.take().hand(job)
    if not job.settle(timeout):
        raise LockTimeout()
    if job.error is not None:
        raise job.error
    return job.result  # type: ignore[no-any-return]


class _Writer:
    """A daemon thread that runs contended transactions for callers, one after another."""

    _idle: ClassVar[list[_Writer]] = []
    _idle_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def take(cls) -> _Writer:
        with cls._idle_lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="gpushare-ledger-writer", daemon=True).start()

    def hand(self, job: _Job) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.work(job.claim)
            except Abandoned:
                pass
            except BaseException as error:  # the caller raises it
                job.error = error
            job.done.release()
            with self._idle_lock:
                self._idle.append(self)


def _forget_helpers() -> None:
    # A forked child has none of its parent's threads: its helpers and writers are new ones.
    _Helper._idle = []
    _Helper._idle_lock = threading.Lock()
    _Writer._idle = []
    _Writer._idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers)
