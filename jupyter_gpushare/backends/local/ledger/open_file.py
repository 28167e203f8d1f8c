"""The ledger's database file as this process holds it (:mod:`.access` keeps it the ledger)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass, field

from jupyter_gpushare.backends.local.ledger.file import FileIdentity


@dataclass
class OpenFile:
    """The database file this process uses, while it is the one at the path."""

    identity: FileIdentity
    fd: int  # read-only: header checks, and it keeps the file's data reachable once deleted
    ledger_id: str
    generation: int
    pid: int = field(default_factory=os.getpid)
    stamp: tuple[int, int] | None = None  # (size, mtime) when the header was last found good
    # Used under the access's lock only: one reads and copies, the other holds the write lock
    # while a copy is taken (a connection cannot back up a database it is writing).
    keeper: sqlite3.Connection | None = None
    writer: sqlite3.Connection | None = None

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # a forked child leaves its parent's handles alone
        for connection in (self.keeper, self.writer):
            if connection is not None:
                with contextlib.suppress(sqlite3.Error):
                    connection.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


__all__ = ["OpenFile"]
