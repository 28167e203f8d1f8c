"""Each thread's sqlite connections to the ledger, and the ledger's lock file (bounded waits).

Used by :class:`~jupyter_gpushare.backends.local.ledger.access.LedgerAccess`. A connection belongs to one
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
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from jupyter_gpushare.backends.local.ledger import faults as ledger_faults
from jupyter_gpushare.backends.local.ledger import view_version
from jupyter_gpushare.backends.local.ledger.file import current_pid, lock_holders
from jupyter_gpushare.backends.local.ledger.lock import LockTimeout, lock_exclusive, unlock
from jupyter_gpushare.core.errors import LedgerError

T = TypeVar("T")
Key = tuple[int, int | None]  # (pid, generation) a thread's connection or descriptor is for
# What a thread holds, with its key, in one attribute: a connection that failed to open leaves
# the thread holding nothing rather than an old handle under no key (a shutdown then crashed
# with a TypeError on the next error's cleanup, and never ended).
Held = tuple[Key, T]


class ThreadConnections:
    def __init__(self, path: Path, lock_timeout: float) -> None:
        self.path = path
        self.lock_path = Path(f"{path}.lock")
        self.lock_timeout = lock_timeout
        self._local = threading.local()
        self._watcher: tuple[tuple[int, int], sqlite3.Connection] | None = None
        self._watcher_lock = threading.Lock()
        # The watcher's data_version at its last read of the views' version, and that version.
        self._seen: tuple[int, int] | None = None

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
        key: Key = (current_pid(), generation)
        held: Held[sqlite3.Connection] | None = getattr(local, "connection", None)
        if held is not None and held[0] == key:
            return held[1]
        self._drop_connection()
        connection = self.connect()  # if it raises, this thread holds none: the next call opens one
        if ledger_faults.not_writable(self.path) is not None:
            # sqlite opened it read-only (mode=rw falls back so): used for this call only, so
            # that the file's fix reaches this thread's next write.
            key = (key[0], None)
        local.connection = (key, connection)
        return connection

    def view_version(self, generation: int, wait: bool = True) -> int | None:
        """The views' version (:mod:`.view_version`), read on the process's connection that never
        writes, and only when its ``PRAGMA data_version`` says someone committed since the last
        read (it counts every commit, by other processes and by this process's other connections
        alike): a look that finds no commit reads sqlite's shared memory only.

        One connection for all threads, used under a lock: the count ``data_version`` gives is
        the connection's own, so one read on another connection could pass for no commit.
        Without ``wait``, None instead of waiting for another thread or for a connection to be
        opened: a look then reads sqlite's shared memory (write-ahead log mode), which a writer
        holds for microseconds (recovering a log after a crash: milliseconds), and after a
        commit the count's page (the operating system's cache: microseconds)."""
        key = (current_pid(), generation)
        if not self._watcher_lock.acquire(blocking=wait):
            return None
        try:
            if self._watcher is None or self._watcher[0] != key:
                if not wait:
                    return None
                if self._watcher is not None and self._watcher[0][0] == key[0]:
                    with contextlib.suppress(sqlite3.Error):
                        self._watcher[1].close()
                self._watcher, self._seen = (key, self.connect(check_same_thread=False)), None
            watcher = self._watcher[1]
            committed = int(watcher.execute("PRAGMA data_version").fetchone()[0])
            if self._seen is None or self._seen[0] != committed:
                # data_version first: a commit between the two reads is counted in the version
                # read, and moves data_version again, so it is looked at once more; never missed.
                self._seen = (committed, view_version.read(watcher))
            return self._seen[1]
        finally:
            self._watcher_lock.release()

    def _drop_connection(self) -> None:
        held: Held[sqlite3.Connection] | None = getattr(self._local, "connection", None)
        self._local.connection = None
        if held is not None and held[0][0] == current_pid():  # a forked child leaves its parent's
            with contextlib.suppress(sqlite3.Error):
                held[1].close()

    def forget(self) -> None:
        """Close this thread's connections; the next call opens new ones."""
        with self._watcher_lock:
            if self._watcher is not None and self._watcher[0][0] == current_pid():
                with contextlib.suppress(sqlite3.Error):
                    self._watcher[1].close()
            self._watcher, self._seen = None, None
        self._drop_connection()

    def close(self) -> None:
        """Close this thread's connections and lock file (other threads' go with their objects)."""
        self.forget()
        self._drop_lock_fd()
        self._local = threading.local()

    # ---- the lock file -------------------------------------------------------------------------

    def lock_fd(self, generation: int) -> int:
        """This thread's descriptor of the lock file (reopened with each generation)."""
        key: Key = (current_pid(), generation)
        held: Held[int] | None = getattr(self._local, "lock", None)
        if held is not None and held[0] == key:
            return held[1]
        self._drop_lock_fd()
        fd = self.open_lock_file()
        self._local.lock = (key, fd)
        return fd

    def _drop_lock_fd(self) -> None:
        held: Held[int] | None = getattr(self._local, "lock", None)
        self._local.lock = None
        if held is not None and held[0][0] == current_pid():
            with contextlib.suppress(OSError):
                os.close(held[1])

    def open_lock_file(self) -> int:
        # The ledger's own permissions (as sqlite does for its WAL files), so a ledger shared
        # by a group of users stays usable by all of them.
        # Its owner always reads and writes it: a ledger made read-only for a while (chmod 0444)
        # must not leave a lock file nobody can open once the ledger is writable again.
        try:
            mode = os.stat(self.path).st_mode & 0o666 | 0o600
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
            raise self.busy() from None

    def busy(self) -> LedgerError:
        """The lock was not had within the lock timeout: the fault, naming who holds it."""
        return ledger_faults.busy(self.path, self.lock_timeout, lock_holders(self.lock_path))

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
