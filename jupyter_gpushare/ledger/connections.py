"""Each thread's sqlite connections to the ledger, and the ledger's lock file (bounded waits).

Used by :class:`~jupyter_gpushare.ledger_access.LedgerAccess`. A connection belongs to one
*generation* of the ledger's file: when the process moves to a restored file, each thread opens
a new connection at its next call. Connections never create the file (``mode=rw``): only the
access layer does that, deliberately.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from . import faults as ledger_faults
from .file import current_pid, lock_holders
from .lock import LockTimeout, lock_exclusive, unlock


class ThreadConnections:
    def __init__(self, path: Path, lock_timeout: float) -> None:
        self.path = path
        self.lock_path = Path(f"{path}.lock")
        self.lock_timeout = lock_timeout
        self._local = threading.local()
        self._watcher: tuple[tuple[int, int], sqlite3.Connection] | None = None
        self._watcher_lock = threading.Lock()

    def connect(self, check_same_thread: bool = True) -> sqlite3.Connection:
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=rw"
        connection = sqlite3.connect(
            uri,
            uri=True,
            isolation_level=None,
            timeout=self.lock_timeout,
            check_same_thread=check_same_thread,
        )
        connection.row_factory = sqlite3.Row
        connection.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
        connection.execute("PRAGMA synchronous = NORMAL")
        return connection

    def connection(self, generation: int) -> sqlite3.Connection:
        """This thread's connection to the file of ``generation``."""
        local = self._local
        key = (current_pid(), generation)
        if getattr(local, "connection_key", None) == key:
            connection: sqlite3.Connection = local.connection
            return connection
        return self._replace("connection", key, self.connect)

    def watcher(self, generation: int) -> sqlite3.Connection:
        """The process's connection that never writes (``PRAGMA data_version`` counts every
        commit, by other processes and by this process's other connections alike). One for all
        threads: each connection counts from its own start, so the markers read on two threads'
        connections could repeat each other across a change."""
        key = (current_pid(), generation)
        with self._watcher_lock:
            if self._watcher is not None and self._watcher[0] == key:
                return self._watcher[1]
            if self._watcher is not None and self._watcher[0][0] == key[0]:
                with contextlib.suppress(sqlite3.Error):
                    self._watcher[1].close()
            connection = self.connect(check_same_thread=False)
            self._watcher = (key, connection)
            return connection

    def _replace(
        self, name: str, key: tuple[int, int], make: Callable[[], sqlite3.Connection]
    ) -> sqlite3.Connection:
        local = self._local
        old: sqlite3.Connection | None = getattr(local, name, None)
        if old is not None and getattr(local, f"{name}_key", (None,))[0] == key[0]:
            with contextlib.suppress(sqlite3.Error):
                old.close()
        setattr(local, f"{name}_key", None)
        connection = make()
        setattr(local, name, connection)
        setattr(local, f"{name}_key", key)
        return connection

    def forget(self) -> None:
        """Close this thread's connections; the next call opens new ones."""
        with self._watcher_lock:
            if self._watcher is not None and self._watcher[0][0] == current_pid():
                with contextlib.suppress(sqlite3.Error):
                    self._watcher[1].close()
            self._watcher = None
        local = self._local
        for name in ("connection", "watcher"):
            connection = getattr(local, name, None)
            if connection is not None and getattr(local, f"{name}_key", (None,))[0] == current_pid():
                with contextlib.suppress(sqlite3.Error):
                    connection.close()
            setattr(local, name, None)
            setattr(local, f"{name}_key", None)

    def close(self) -> None:
        """Close this thread's connections and lock file (other threads' go with their objects)."""
        self.forget()
        lock = getattr(self._local, "lock", None)
        if lock is not None and getattr(self._local, "lock_key", (None,))[0] == os.getpid():
            with contextlib.suppress(OSError):
                os.close(lock)
        self._local = threading.local()

    # ---- the lock file -------------------------------------------------------------------------

    def lock_fd(self, generation: int) -> int:
        """This thread's descriptor of the lock file (reopened with each generation)."""
        local = self._local
        key = (current_pid(), generation)
        fd: int | None = getattr(local, "lock", None)
        if fd is None or getattr(local, "lock_key", None) != key:
            if fd is not None and getattr(local, "lock_key", (None,))[0] == os.getpid():
                with contextlib.suppress(OSError):
                    os.close(fd)
            fd = self.open_lock_file()
            local.lock, local.lock_key = fd, key
        return fd

    def drop_lock(self) -> None:
        """Forget this thread's lock descriptor: after a timeout its waiter owns it."""
        self._local.lock = None

    def open_lock_file(self) -> int:
        # The ledger's own permissions (as sqlite does for its WAL files), so a ledger shared
        # by a group of users stays usable by all of them.
        try:
            mode = os.stat(self.path).st_mode & 0o666
        except OSError:
            mode = 0o600
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, mode)
        # os.open's mode is cut by the umask (0022 takes a group's write bit): set it as sqlite
        # does for its WAL files, where this process owns the file.
        with contextlib.suppress(OSError):
            found = os.fstat(fd)
            if found.st_uid == os.geteuid() and found.st_mode & 0o666 != mode:
                os.fchmod(fd, mode)
        return fd

    def lock(self, fd: int) -> None:
        """Lock ``fd`` within the lock timeout, or say which process holds the lock."""
        try:
            lock_exclusive(fd, self.lock_timeout)
        except LockTimeout:
            holders = lock_holders(self.lock_path)
            raise ledger_faults.busy(self.path, self.lock_timeout, holders) from None

    @contextlib.contextmanager
    def locked_note(self) -> Iterator[int]:
        """The lock file at the path, locked, for reading or writing its note."""
        fd = self.open_lock_file()
        try:
            self.lock(fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            yield fd
        finally:
            unlock(fd)
            os.close(fd)
