"""A file lock with a time limit, that keeps the kernel's first-come-first-served wake-ups.

The ledger's writers queue on ``flock`` before asking sqlite: the kernel wakes blocked waiters
in turn, where sqlite's own busy handler sleeps and retries and lets one process starve the
others. A blocking ``flock`` cannot be given a timeout, though, and a process that hangs while
holding the lock must not hang every server, CLI and kernel of the node with it. So an
uncontended lock is taken at once, and a contended one is waited for by a helper thread that
the caller stops waiting for after ``timeout`` seconds. An abandoned helper keeps the
descriptor: when it finally gets the lock it lets go at once and closes it.
"""

from __future__ import annotations

import fcntl
import os
import threading


class LockTimeout(Exception):
    """The lock was not free within the time limit; the descriptor now belongs to the waiter."""


def lock_exclusive(fd: int, timeout: float) -> None:
    """Take an exclusive ``flock`` on ``fd`` within ``timeout`` seconds or raise LockTimeout.

    After a LockTimeout the caller must neither use nor close ``fd`` again.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    waiter = _Waiter(fd)
    if not waiter.wait(timeout):
        raise LockTimeout()


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


class _Waiter:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mutex = threading.Lock()
        self._done = threading.Event()
        self._acquired = False
        self._abandoned = False
        threading.Thread(target=self._run, name="gpushare-ledger-lock", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            self._done.set()
            return
        with self._mutex:
            if self._abandoned:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                return
            self._acquired = True
        self._done.set()

    def wait(self, timeout: float) -> bool:
        self._done.wait(timeout)
        with self._mutex:
            if self._acquired:
                return True
            self._abandoned = True
            return False
