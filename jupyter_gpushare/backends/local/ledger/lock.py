"""A file lock with a time limit, that keeps the kernel's first-come-first-served wake-ups.

The ledger's writers queue on ``flock`` before asking sqlite: the kernel wakes blocked waiters
in turn, where sqlite's own busy handler sleeps and retries and lets one process starve the
others. A blocking ``flock`` cannot be given a timeout, though, and a process that hangs while
holding the lock must not hang every server, CLI and kernel of the node with it. So a free lock
is taken at once, and a contended one is waited for by a kept thread that the caller stops
waiting for after ``timeout`` seconds:

* a write transaction (:func:`run_in_writer`) runs whole in that thread, which holds the lock
  only while it runs: handing the lock back to a waiting caller would keep it held while the
  caller waits for a CPU (docs/benchmarks.md, "The ledger at four processes");
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

# A write holds the lock for a few hundred microseconds: a contended lock is tried again over
# about 3 ms before a kept thread queues for it, which costs two thread hand-offs (the figures
# that chose these waits: docs/benchmarks.md, "The ledger at four processes").
_SHORT_WAITS = (0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0008)


class LockTimeout(Exception):
    """The lock was not free within the time limit; the descriptor now belongs to the waiter."""


def lock_exclusive(fd: int, timeout: float) -> None:
    """Take an exclusive ``flock`` on ``fd`` within ``timeout`` seconds or raise LockTimeout.

    After a LockTimeout the caller must neither use nor close ``fd`` again: the kept thread
    still waiting for it lets go as soon as it gets the lock, and closes it.
    """
    if try_lock(fd):
        return

    def take(claim: Callable[[], bool]) -> None:
        lock_blocking(fd)
        if not claim():
            unlock(fd)
            os.close(fd)
            raise Abandoned()

    run_in_writer(take, timeout)


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
    _Kept.take().hand(lambda: _run_job(job))
    if not job.settle(timeout):
        raise LockTimeout()
    if job.error is not None:
        raise job.error
    return job.result  # type: ignore[no-any-return]


def _run_job(job: _Job) -> None:
    """In a kept thread: the job's transaction, its result or error kept for its caller."""
    try:
        job.result = job.work(job.claim)
    except Abandoned:
        pass
    except BaseException as error:  # the caller raises it
        job.error = error
    job.done.release()


class _Kept:
    """A daemon thread that runs what it is handed, one after another, kept for the next: with
    several processes writing nearly every write meets a held lock, and starting a thread for
    each would cost more than the write itself."""

    _idle: ClassVar[list[_Kept]] = []  # waiting for the next contended lock
    _idle_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def take(cls) -> _Kept:
        with cls._idle_lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="gpushare-ledger-lock", daemon=True).start()

    def hand(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def _run(self) -> None:
        while True:
            self._tasks.get()()
            with self._idle_lock:
                self._idle.append(self)


def _forget_helpers() -> None:
    # A forked child has none of its parent's threads: its kept threads are new ones.
    _Kept._idle = []
    _Kept._idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers)
