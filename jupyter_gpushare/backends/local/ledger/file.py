"""The ledger file's identity: which file a process holds, who else holds it, how to put it back.

A process opens the ledger once and keeps it open; if someone deletes or replaces the file at
``ledger_path`` meanwhile, the process would go on deciding in a file nobody else sees while new
processes start an empty one — and hand out a card twice. Three things prevent that:

* the *note* in the lock file (``<ledger>.lock``): the ledger's id and the (device, inode) of the
  database file it names, written whenever a process creates, adopts or restores the ledger, so
  a process that opens the path can tell a fresh node from a file that is not the one the
  others use;
* the *holders*: live processes with the file open, as ``/proc/<pid>/fd`` shows them (a deleted
  file reads ``<path> (deleted)``) and, since another user's descriptors cannot be read,
  ``/proc/locks``: sqlite holds a shared lock on a database it has open in WAL mode, listed there
  for every user. So nobody starts an empty ledger while one of them still holds the previous
  one;
* *restoration*: a holder copies its open database with sqlite's online backup into a temporary
  file and links it into place (``link`` never overwrites, so two restorers cannot both win).

Linux-only where ``/proc`` is needed; elsewhere nobody is found holding anything, and only the
note protects the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

FileIdentity = tuple[int, int]  # (st_dev, st_ino)

SQLITE_MAGIC = b"SQLite format 3\x00"
_PROC = Path("/proc")


_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def current_pid() -> int:
    """This process's pid, without a system call per ledger call (refreshed in forked children)."""
    return _pid[0]


def identity_of(path: str | os.PathLike[str]) -> FileIdentity | None:
    """The file at ``path`` now, or None when there is none."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return (status.st_dev, status.st_ino)


def fd_identity(fd: int) -> FileIdentity:
    status = os.fstat(fd)
    return (status.st_dev, status.st_ino)


def header_problem(fd: int) -> str | None:
    """Why the open file ``fd`` is not an sqlite database any more (None when it looks like one).

    One ``pread`` of 100 bytes: cheap enough for every ledger call, and it sees a file truncated
    or overwritten in place, which the file's identity does not.
    """
    header = os.pread(fd, 100, 0)
    if not header:
        return "the file is empty: it was truncated"
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "file is not a database"
    return None


def new_ledger_id() -> str:
    return uuid.uuid4().hex


# ---- the note in the lock file ----------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """What the lock file says about the ledger: its id, its file, and its predecessor.

    ``descends_from`` is set on a ledger started afresh to replace a damaged one: processes of
    the old ledger recognise it as theirs and record their slices in it again.
    """

    ledger_id: str
    database: FileIdentity
    descends_from: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"ledger": self.ledger_id, "database": list(self.database), "from": self.descends_from}
        )


def read_note(fd: int) -> Note | None:
    """The note of an open lock file; None for an empty, foreign or garbled one."""
    raw = os.pread(fd, 4096, 0)
    try:
        data = json.loads(raw.decode())
        database = (int(data["database"][0]), int(data["database"][1]))
        return Note(str(data["ledger"]), database, data.get("from") or None)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError):
        return None


def write_note(fd: int, note: Note) -> None:
    """Replace the note (the caller holds the lock, so no reader sees half of it)."""
    data = note.to_json().encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


# ---- who holds the file ------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"{self.pid} ({self.command})" if self.command else str(self.pid)


def describe(holders: Iterable[Holder]) -> str:
    """``process 123 (jupyter-server …)`` or ``processes 1 (…), 2 (…)``."""
    listed = list(holders)
    if not listed:
        return "no process this one can see"
    noun = "process" if len(listed) == 1 else "processes"
    return f"{noun} " + ", ".join(str(holder) for holder in listed[:5])


def command_of(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    words = [word.decode(errors="replace") for word in raw.split(b"\0") if word]
    if words:
        words[0] = os.path.basename(words[0])
    text = " ".join(words)
    return text if len(text) <= 80 else text[:77] + "..."


def holders(names: Iterable[str] = (), files: Iterable[FileIdentity] = ()) -> list[Holder]:
    """Other live processes with an open descriptor on one of ``files`` (by device and inode,
    wherever the file now is, deleted or moved) or whose ``/proc`` link reads one of ``names``
    (a deleted file's link is ``"<path> (deleted)"``).

    Descriptors are seen only of the processes this one may inspect (its user's, and none under
    ``hidepid``); a process of another user that has one of ``files`` open as an sqlite database
    is found by the lock sqlite holds on it (``/proc/locks`` lists every user's). Its command
    may then read ``""``."""
    wanted_names, wanted_files = set(names), set(files)
    own = os.getpid()
    try:
        pids = [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        pids = []
    found = [
        pid for pid in pids if pid != own and _holds(_PROC / str(pid) / "fd", wanted_names, wanted_files)
    ]
    found += [pid for pid in _locking_pids(wanted_files, waiters=True) if pid not in found]
    return [Holder(pid, command_of(pid)) for pid in found]


def _holds(directory: Path, names: set[str], files: set[FileIdentity]) -> bool:
    try:
        descriptors = os.listdir(directory)
    except OSError:
        return False
    for descriptor in descriptors:
        link = directory / descriptor
        try:
            target = os.readlink(link)
            if target in names:
                return True
            if files and target.startswith("/"):
                status = os.stat(link)  # follows the descriptor to the very file it has open
                if (status.st_dev, status.st_ino) in files:
                    return True
        except OSError:
            continue
    return False


def deleted(path: str | os.PathLike[str]) -> str:
    return f"{os.path.abspath(path)} (deleted)"


def lock_holders(path: str | os.PathLike[str]) -> list[Holder]:
    """Processes holding a lock (flock or POSIX) on the file at ``path``, from ``/proc/locks``."""
    try:
        identity = identity_of(path)
    except OSError:
        return []
    if identity is None:
        return []
    return [Holder(pid, command_of(pid)) for pid in _locking_pids({identity}, waiters=False)]


def _locking_pids(files: set[FileIdentity], waiters: bool) -> list[int]:
    """Other processes with a lock on one of ``files`` (``waiters``: or waiting for one), in the
    order ``/proc/locks`` lists them."""
    if not files:
        return []
    try:
        lines = (_PROC / "locks").read_text().splitlines()
    except OSError:
        return []
    wanted = {f"{os.major(device):02x}:{os.minor(device):02x}:{inode}" for device, inode in files}
    pids: list[int] = []
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's line has "->" in front)
        fields = line.split()
        if "->" in fields:
            if not waiters:
                continue
            fields.remove("->")
        if len(fields) >= 6 and fields[5] in wanted and fields[4].isdigit():
            pid = int(fields[4])
            if pid not in pids and pid != os.getpid():
                pids.append(pid)
    return pids


# ---- putting a ledger in place -------------------------------------------------------------


def new_ledger_mode(path: Path) -> int | None:
    """The mode of a ledger started afresh at ``path`` (its holders' copy keeps the old one):
    read and write for the group where the directory is shared through one (the setgid bit, as
    on a team box), so that every member may write what any member starts; else None, the
    umask's (which would leave the others a read-only ledger)."""
    try:
        shared = bool(os.stat(path.parent).st_mode & stat.S_ISGID)
    except OSError:
        return None
    return 0o660 if shared else None


def link_into_place(source: sqlite3.Connection, path: Path, mode: int | None) -> FileIdentity:
    """Copy the database open on ``source`` to a temporary file and link it at ``path``.

    Raises ``FileExistsError`` when a file appeared at ``path`` meanwhile: it is never replaced.
    The copy is complete and durable before anyone can see it. The caller holds the ledger's
    lock file, so no process of ours creates a file at ``path`` meanwhile.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        target = sqlite3.connect(temporary, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = WAL")
            target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            target.close()
        for leftover in (f"{temporary}-wal", f"{temporary}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        if mode is not None:
            os.chmod(temporary, mode)
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if os.path.lexists(path):
            raise FileExistsError(path)
        # A WAL file left at the path by the previous database (moved away, or deleted on its
        # own) would be replayed into this one by the next process to open it.
        for stale in (f"{path}-wal", f"{path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        os.link(temporary, path)
        identity = identity_of(path)
        assert identity is not None
        return identity
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
