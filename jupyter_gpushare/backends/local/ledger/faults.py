"""Each way the ledger file can fail, as one sentence that names the file and the fix.

The ledger calls :func:`classify` on any sqlite or OS error it meets; users see the sentence in
``jupyter gpushare status`` (exit status 1), as a REST 503, in ``%gpu`` and as the panel's
problem banner. The class of the error says what kind of fault it is; the text is for people.
"""

from __future__ import annotations

import errno
import getpass
import os
import sqlite3
from pathlib import Path

from jupyter_gpushare.backends.local.ledger.file import Holder, describe, lock_holders
from jupyter_gpushare.core.errors import (
    LedgerBusyError,
    LedgerDamagedError,
    LedgerError,
    LedgerMissingError,
    LedgerReadOnlyError,
    LedgerReplacedError,
)

_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_READ_ONLY = ("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH")
_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")
_DAMAGED_WORDS = ("not a database", "malformed", "no such table", "no such column")


def damaged(path: Path, detail: str) -> LedgerDamagedError:
    return LedgerDamagedError(
        f"The GPU ledger {path} is damaged ({detail}): move it away (mv {path} {path}.broken); "
        "the servers and kernels that use it then record their GPU slices in a new one."
    )


def read_only(path: Path, detail: str) -> LedgerReadOnlyError:
    user = _user()
    return LedgerReadOnlyError(
        f"The GPU ledger {path} is read-only for user {user} ({detail}): give {user} write "
        f"access to it and to {path.parent} (chmod or chown; chattr -i if it was made "
        f"immutable), or set c.GPUShare.ledger_path to a file {user} can write."
    )


def not_writable(path: Path) -> LedgerReadOnlyError | None:
    """The read-only fault of a ledger file this process may not write now — its mode or owner,
    an immutable flag, a read-only filesystem — or None (also while there is no file yet).

    One system call when all is well. Every write and every check asks it first: sqlite would go
    on writing through descriptors it opened before the file was made read-only (into the
    write-ahead log), while new connections could not, so without it the verdict would depend on
    which thread asks.
    """
    if os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        return None
    try:
        os.close(os.open(path, os.O_WRONLY))  # says why (and root may write a mode-0444 file)
    except FileNotFoundError:
        return None
    except OSError as error:
        return read_only(path, f"{error.strerror or error} opening it for writing")
    return None


def busy(path: Path, waited: float, holders: list[Holder]) -> LedgerBusyError:
    who = describe(holders) if holders else "another process"
    return LedgerBusyError(
        f"The GPU ledger {path} stayed locked for {waited:g} s by {who}: nothing was changed; "
        "try again, and if that process hangs, stop it."
    )


def missing(path: Path, holders: list[Holder]) -> LedgerMissingError:
    return LedgerMissingError(
        f"The GPU ledger {path} was deleted while {describe(holders)} still holds it open "
        "with the GPU slices of running kernels; such a process puts the file back within a "
        "second, and this one did not: stop it, or wait until it ends, before starting a new "
        "ledger."
    )


def replaced(path: Path, holders: list[Holder]) -> LedgerReplacedError:
    return LedgerReplacedError(
        f"The GPU ledger {path} was replaced by another file while {describe(holders)} still "
        f"holds the previous ledger; no GPU slice is placed until you move {path} away "
        "(the previous ledger is then put back) or stop those processes."
    )


def classify(error: BaseException, path: Path, lock_timeout: float) -> LedgerError:
    """The ledger fault an sqlite or OS error stands for (sqlite waits ``lock_timeout`` s when
    the database is locked before it says so)."""
    if isinstance(error, LedgerError):
        return error
    if isinstance(error, sqlite3.Error):
        name = str(getattr(error, "sqlite_errorname", "") or "")
        text = str(error)
        if name.startswith(_DAMAGED) or any(words in text for words in _DAMAGED_WORDS):
            return damaged(path, text)
        if name.startswith(_READ_ONLY) or "readonly" in text:
            return not_writable(path) or read_only(path, text)  # the file's own reason first
        if name.startswith(_BUSY) or "locked" in text:
            return busy(path, lock_timeout, lock_holders(path) or lock_holders(f"{path}-shm"))
        if (name.startswith("SQLITE_CANTOPEN") or "unable to open" in text) and not _writable(path):
            return not_writable(path) or read_only(path, text)
        if name.startswith("SQLITE_FULL"):
            return LedgerError(f"The GPU ledger {path} cannot grow: the disk is full ({text}).")
        return LedgerError(f"The GPU ledger {path} cannot be used: {text}.")
    if isinstance(error, OSError):
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return not_writable(path) or read_only(path, error.strerror or str(error))
        if error.errno == errno.ENOSPC:
            return LedgerError(f"The GPU ledger {path} cannot grow: the disk is full.")
        return LedgerError(f"The GPU ledger {path} cannot be used: {error.strerror or error}.")
    return LedgerError(f"The GPU ledger {path} cannot be used: {error}.")


def _writable(path: Path) -> bool:
    target = path if path.exists() else path.parent
    return os.access(target, os.W_OK) and os.access(path.parent, os.W_OK)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
