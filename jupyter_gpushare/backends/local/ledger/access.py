"""Opening the ledger file and keeping it the ledger: connections, bounded writes, restoration.

:class:`~jupyter_gpushare.backends.local.ledger.Ledger` asks this module for a connection to read and for a
write transaction; this module makes sure both are on *the* ledger — the file at
``ledger_path`` that every process of the node uses:

* every call compares the file at the path (its identity, and its first bytes) with the file
  this process opened — a few microseconds;
* a file deleted under a running process is put back from the process's open copy (sqlite's
  online backup), within one call or one guard round (``guard``), and every process of the old
  file follows it there;
* a file damaged in place or replaced by another one stops every placement with a sentence
  that names the file and the fix; once the file is moved away, the processes that used it put
  their ledger back (a damaged one is started afresh with the slices they last saw);
* a process that finds no file, or a file the lock file's note does not name, while other live
  processes still hold the previous one, waits a few seconds for them to put it back and
  otherwise refuses — it never starts a second, empty ledger beside theirs;
* lock waits are bounded and a timeout names the process holding the lock.

See :mod:`jupyter_gpushare.backends.local.ledger.file` for the note, the holders and the copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from jupyter_gpushare.backends.local.ledger import faults as ledger_faults
from jupyter_gpushare.backends.local.ledger.connections import ThreadConnections
from jupyter_gpushare.backends.local.ledger.file import (
    FileIdentity,
    Holder,
    Note,
    command_of,
    current_pid,
    deleted,
    fd_identity,
    header_problem,
    holders,
    identity_of,
    link_into_place,
    new_ledger_id,
    new_ledger_mode,
    read_note,
    write_note,
)
from jupyter_gpushare.backends.local.ledger.guard import Guard
from jupyter_gpushare.backends.local.ledger.lock import (
    Abandoned,
    LockTimeout,
    lock_blocking,
    run_in_writer,
    try_lock,
    unlock,
)
from jupyter_gpushare.backends.local.ledger.open_file import OpenFile
from jupyter_gpushare.backends.local.ledger.schema import (
    Row,
    finish_transaction,
    forget_an_earlier_boot,
    initialise,
    ledger_id_of,
    ledger_id_of_safe,
    new_database,
    record_again,
    replace_devices,
    slice_dicts,
    write_transaction,
)
from jupyter_gpushare.backends.processes import boot_id
from jupyter_gpushare.core.errors import LedgerError

T = TypeVar("T")

LOCK_TIMEOUT = 10.0  # seconds any ledger lock is waited for before the caller is told who holds it
RESTORE_WAIT = 5.0  # seconds a process waits for the holders of a deleted ledger to put it back

log = logging.getLogger("jupyter_gpushare")


class LedgerAccess:
    """One ledger path as this process sees it. Thread-safe; fork-aware."""

    def __init__(
        self,
        path: Path,
        alive: Callable[[Row], bool],
        lock_timeout: float = LOCK_TIMEOUT,
        restore_wait: float = RESTORE_WAIT,
    ) -> None:
        self.path = path
        self._path_text = os.fspath(path)
        self.lock_path = Path(f"{path}.lock")
        self.lock_timeout = lock_timeout
        self.restore_wait = restore_wait
        self._alive = alive
        self._state = threading.RLock()
        self._file: OpenFile | None = None
        self._generation = 0
        self._threads = ThreadConnections(path, lock_timeout)
        # What this process last saw, to start a damaged ledger afresh without losing a slice.
        self._devices: list[dict[str, Any]] = []
        self._slice_rows: Sequence[Sequence[Any]] = ()  # as read, in SLICE_COLUMNS order
        self._failed = False  # the last attempt to open or follow the file failed
        # Checks the file every round once started (a daemon thread, one per process), and
        # logs each fault once, whoever meets it.
        self.guard = Guard(path, self.check, lambda: self._file is not None or self._failed)
        self.on_check: Callable[[], None] | None = None  # the ledger's own round (devices)

    # ---- what the ledger uses --------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Changes whenever this process moves to another file (a restored ledger)."""
        return self._generation

    def read(self) -> sqlite3.Connection:
        """This thread's connection to the ledger, checked to be on the file at the path."""
        file = self._current()
        return self._threads.connection(file.generation)

    def transact(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in one write transaction and commit (roll back if it raises).

        A free lock is taken in this thread. A held one is waited for by a writer thread that
        then runs the whole transaction, so that the lock is held only by a running thread and
        not by one the kernel has yet to give a CPU to; this thread waits for it up to the lock
        timeout, and is then told which process holds the lock.
        """
        begun = self._begin(try_lock)
        if begun is not None:
            return finish_transaction(*begun, work)

        def in_writer(claim: Callable[[], bool]) -> T:
            def take(fd: int) -> bool:
                lock_blocking(fd)
                if not claim():
                    unlock(fd)
                    raise Abandoned()
                return True

            try:
                begun = self._begin(take)
                assert begun is not None
                return finish_transaction(*begun, work)
            except (sqlite3.Error, OSError):
                self._threads.forget()  # the writer's connections: reopened by its next job
                raise

        try:
            return run_in_writer(in_writer, self.lock_timeout)
        except LockTimeout:
            raise self._threads.busy() from None

    def change_marker(self) -> int:
        """A number that changes whenever anyone commits what a view could show (the views'
        version, :mod:`.view_version`), and whenever this process moves to another file."""
        marker = self._marker(self._current(), wait=True)
        assert marker is not None
        return marker

    def change_marker_at_once(self) -> int | None:
        """The same if it takes no more than a stat and a read of sqlite's shared memory (and
        after a commit, of one cached page); None if the file is to be opened, followed or put
        back, or the watching connection is busy."""
        return self._marker(self._unchanged_file(), wait=False)

    def _marker(self, file: OpenFile | None, wait: bool) -> int | None:
        version = None if file is None else self._threads.view_version(file.generation, wait)
        if version is None:
            return None
        return (self._generation << 48) + version

    def forget_thread_connections(self) -> None:
        """Drop this thread's connections (after an error: the next call opens new ones, which
        also picks up a permission that was fixed meanwhile)."""
        self._threads.forget()

    def remember(
        self, devices: Sequence[Row] | None = None, slices: Sequence[Sequence[Any]] | None = None
    ) -> None:
        """What the ledger last held, as far as this process read it (``slices`` as read, in
        SLICE_COLUMNS order: made into rows only when a ledger is started afresh)."""
        if devices is not None:
            self._devices = [dict(row) for row in devices]
        if slices is not None:
            self._slice_rows = slices

    def fault(self, error: BaseException) -> LedgerError:
        return ledger_faults.classify(error, self.path, self.lock_timeout)

    # ---- the guard's round ---------------------------------------------------------------------

    def check(self) -> LedgerError | None:
        """Follow or put back the file and retry what failed; the fault now, or None."""
        try:
            file = self._current()
            self._require_writable()
            with self._state:
                if file.keeper is not None and ledger_id_of(file.keeper) not in (None, file.ledger_id):
                    raise ledger_faults.damaged(self.path, "another ledger was copied over it")
            if self.on_check is not None:
                self.on_check()
        except LedgerError as error:
            return error
        except (sqlite3.Error, OSError) as error:
            self.forget_thread_connections()
            return self.fault(error)
        return None

    def close(self) -> None:
        """Close this thread's connections and the file (other threads' close with them)."""
        self._threads.close()
        with self._state:
            if self._file is not None:
                self._file.close()
                self._file = None

    # ---- the current file --------------------------------------------------------------------

    def _current(self) -> OpenFile:
        file = self._unchanged_file()
        if file is not None:
            return file
        with self._state:
            try:
                settled = self._settle()
            except BaseException:
                self._failed = True  # the guard keeps trying
                raise
            self._failed = False
            return settled

    def _unchanged_file(self) -> OpenFile | None:
        """The file this process opened, if it is still the one at the path (a stat)."""
        file = self._file
        return file if file is not None and file.pid == current_pid() and self._still_at_path(file) else None

    def _still_at_path(self, file: OpenFile) -> bool:
        """Whether ``file`` is still the file at the path (one stat; its header is read again
        only when the file changed: in WAL mode, at checkpoints). Raises when it is damaged."""
        try:
            status = os.stat(self._path_text)
        except FileNotFoundError:
            return False
        if (status.st_dev, status.st_ino) != file.identity:
            return False
        stamp = (status.st_size, status.st_mtime_ns)
        if stamp != file.stamp:
            problem = header_problem(file.fd)
            if problem is not None:
                raise ledger_faults.damaged(self.path, problem)
            file.stamp = stamp
        return True

    def _settle(self) -> OpenFile:
        file = self._file
        if file is None or file.pid != current_pid():
            self._file = None
            return self._open_path()
        now = identity_of(self.path)
        if now == file.identity:
            problem = header_problem(file.fd)
            if problem is not None:
                raise ledger_faults.damaged(self.path, problem)
            return file
        if now is None:
            return self._restore(file)
        return self._follow(file, now)

    def _open_path(self) -> OpenFile:
        """First open in this process: create, adopt, or wait for the holders of the old file."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        deadline = time.monotonic() + self.restore_wait
        while True:
            with self._threads.locked_note() as lock:
                note = read_note(lock)
                now = identity_of(self.path)
                refusal = self._refusal(note, now)
                if refusal is None:
                    if now is None:
                        return self._create(lock, descends_from=None, slices=())
                    opened = self._adopt(lock, note, now)
                    if opened is not None:
                        return opened
                    continue  # the file changed while we looked: look again
            # A missing file is put back by its holders within a round; a stranger stays.
            if now is not None or time.monotonic() >= deadline:
                raise refusal
            time.sleep(0.1)

    def _refusal(self, note: Note | None, now: FileIdentity | None) -> LedgerError | None:
        """Why a new ledger must not be started (or this file not adopted) yet, or None.

        The processes that matter are those holding the file the note names (deleted, moved
        away or replaced); without a note (the lock file went too), those holding a deleted
        file of the ledger's name.
        """
        if note is not None and note.database == now:
            return None
        previous = holders(files=[note.database]) if note is not None else holders([deleted(self.path)])
        if not previous:
            return None
        if now is None:
            return ledger_faults.missing(self.path, previous)
        return ledger_faults.replaced(self.path, previous)

    def _adopt(self, lock: int, note: Note | None, now: FileIdentity) -> OpenFile | None:
        """Open the file at the path as this process's ledger (initialising what it lacks)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if fd_identity(fd) != now:
            os.close(fd)
            return None
        ours = note is not None and note.database == now
        problem = header_problem(fd)
        if problem is not None and (ours or holders(files=[now])):
            os.close(fd)
            raise ledger_faults.damaged(self.path, problem)
        # An empty file nobody holds is a ledger an older release had just begun: initialise it.
        file = OpenFile(now, fd, "", self._generation + 1)
        try:
            file.keeper = self._threads.connect(check_same_thread=False)
            file.writer = self._threads.connect(check_same_thread=False)
            file.writer.execute("PRAGMA journal_mode = WAL")
            with write_transaction(file.writer):
                found = ledger_id_of_safe(file.writer)
                overwritten = ours and found is not None and note is not None and found != note.ledger_id
                if overwritten and holders(files=[now]):
                    raise ledger_faults.damaged(self.path, "another ledger was copied over it")
                file.ledger_id = initialise(file.writer, note.ledger_id if ours and note else new_ledger_id())
                gone = forget_an_earlier_boot(file.writer, boot_id())
            if gone:
                log.warning("jupyter_gpushare: %s: released %d slice(s) of the last boot", self.path, gone)
        except BaseException:
            file.close()
            raise
        write_note(lock, Note(file.ledger_id, now, note.descends_from if ours and note else None))
        return self._use(file)

    def _create(self, lock: int, descends_from: str | None, slices: Sequence[Row]) -> OpenFile:
        """Start a ledger at the (free) path: empty, or with the rows of a damaged one."""
        ledger_id = new_ledger_id()
        source = new_database()
        try:
            with write_transaction(source):
                initialise(source, ledger_id)
                forget_an_earlier_boot(source, boot_id())  # notes this boot: there is nothing yet
                # The pool this process knows: a server registers it only when it starts.
                replace_devices(source, self._devices)
                if descends_from is not None:
                    source.execute(
                        "INSERT INTO meta (key, value) VALUES ('descends_from', ?)", (descends_from,)
                    )
                    record_again(source, [row for row in slices if self._alive(row)])
            identity = link_into_place(source, self.path, new_ledger_mode(self.path))
        finally:
            source.close()
        write_note(lock, Note(ledger_id, identity, descends_from))
        opened = self._open_known(identity, ledger_id)
        return self._use(opened)

    def _open_known(self, identity: FileIdentity, ledger_id: str) -> OpenFile:
        """Open a ledger file whose identity and id are known (one this process just placed or
        one the note says is its ledger's successor)."""
        fd = os.open(self.path, os.O_RDONLY)
        file = OpenFile(identity, fd, ledger_id, self._generation + 1)
        try:
            if fd_identity(fd) != identity:
                raise ledger_faults.replaced(self.path, [])
            file.keeper = self._threads.connect(check_same_thread=False)
            file.writer = self._threads.connect(check_same_thread=False)
        except BaseException:
            file.close()
            raise
        return file

    def _use(self, file: OpenFile) -> OpenFile:
        previous, self._file = self._file, file
        self._generation = file.generation
        if previous is not None:
            previous.close()
        return file

    # ---- when the file at the path is not ours any more -----------------------------------------

    def _follow(self, file: OpenFile, now: FileIdentity) -> OpenFile:
        """Another file is at the path: our ledger put back by another process, or a stranger."""
        with self._threads.locked_note() as lock:
            return self._follow_unlocked(file, now, read_note(lock))

    def _restore(self, file: OpenFile) -> OpenFile:
        """The file is gone: put it back from our open copy, or afresh if that copy is damaged."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # the whole directory may be
        with self._threads.locked_note() as lock:
            now = identity_of(self.path)
            if now is not None:
                return self._follow_unlocked(file, now, read_note(lock))
            writer = file.writer
            assert writer is not None and file.keeper is not None
            locked = False
            try:
                try:
                    writer.execute("BEGIN IMMEDIATE")  # no other process writes while we copy
                    locked = True
                    healthy = header_problem(file.fd) is None and ledger_id_of(file.keeper) == file.ledger_id
                except sqlite3.Error:
                    healthy = False
                if healthy:
                    mode = os.fstat(file.fd).st_mode & 0o777
                    identity = link_into_place(file.keeper, self.path, mode)
                    write_note(lock, Note(file.ledger_id, identity, None))
                    log.warning(
                        "jupyter_gpushare: the GPU ledger %s was deleted; put back from this process's "
                        "open copy",
                        self.path,
                    )
                    restored = self._open_known(identity, file.ledger_id)
                else:
                    restored = self._create(lock, file.ledger_id, slice_dicts(self._slice_rows))
                    log.warning(
                        "jupyter_gpushare: the damaged GPU ledger %s was moved away; started afresh "
                        "with the %d slice(s) this process last saw",
                        self.path,
                        len(self._slice_rows),
                    )
                    return restored
            finally:
                if locked:
                    with contextlib.suppress(sqlite3.Error):
                        writer.execute("ROLLBACK")
        return self._use(restored)

    def _follow_unlocked(self, file: OpenFile, now: FileIdentity, note: Note | None) -> OpenFile:
        """Follow the ledger to the file at the path if the note (read under the lock) says it
        is ours, restored by another process or started afresh to replace our damaged one."""
        if note is not None and note.database == now:
            if note.ledger_id == file.ledger_id:
                log.info("jupyter_gpushare: following the GPU ledger %s to its restored file", self.path)
                return self._use(self._open_known(now, note.ledger_id))
            if note.descends_from == file.ledger_id:
                opened = self._use(self._open_known(now, note.ledger_id))
                self._record_again(opened)
                return opened
        raise ledger_faults.replaced(self.path, [Holder(os.getpid(), command_of(os.getpid()))])

    def _record_again(self, file: OpenFile) -> None:
        """Write the slices this process last saw into a ledger started afresh by another."""
        assert file.writer is not None
        with write_transaction(file.writer):
            if self._devices and not file.writer.execute("SELECT 1 FROM devices").fetchone():
                replace_devices(file.writer, self._devices)
            slices = slice_dicts(self._slice_rows)
            added = record_again(file.writer, [row for row in slices if self._alive(row)])
        if added:
            log.warning(
                "jupyter_gpushare: recorded %d GPU slice(s) again in the new ledger %s", added, self.path
            )

    def _require_writable(self) -> None:
        fault = ledger_faults.not_writable(self.path)
        if fault is not None:
            raise fault

    def _begin(self, take_lock: Callable[[int], bool]) -> tuple[sqlite3.Connection, int] | None:
        """``BEGIN IMMEDIATE`` under the file lock, on the file at the path; None when
        ``take_lock`` did not get the lock."""
        self._require_writable()  # before sqlite writes through a descriptor opened earlier
        # The file is checked once per transaction, once the write lock is held, so that no
        # write can land in a file that was deleted or replaced a moment before; following or
        # putting back the file happens outside the lock (it takes the lock file's note).
        for _ in range(5):
            file = self._file
            if file is None or file.pid != current_pid():
                file = self._current()
            connection = self._threads.connection(file.generation)
            lock = self._threads.lock_fd(file.generation)
            if not take_lock(lock):
                return None
            try:
                connection.execute("BEGIN IMMEDIATE")
            except BaseException:
                unlock(lock)
                raise
            try:
                if self._file is file and self._still_at_path(file):
                    return connection, lock
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                unlock(lock)
                raise
            connection.execute("ROLLBACK")
            unlock(lock)
            self._current()  # follow the file, or put it back, or say why not
        raise LedgerError(f"The GPU ledger {self.path} keeps changing under this process; try again.")
