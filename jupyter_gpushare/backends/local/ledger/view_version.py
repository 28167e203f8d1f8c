"""The views' version: a count in the ledger's file that moves with every commit a view of the
pool or of the kernels could show, and with no other (sqlite triggers keep it).

sqlite's ``PRAGMA data_version`` moves with every commit, and the accounting commits a second
or so after every start and end when it folds the events its triggers recorded into figures no
view shows; a change marker on ``data_version`` alone made every stream send an unchanged pool
again after each start and end. ``data_version`` stays the cheap look ("did anyone commit?": a
read of sqlite's shared memory); only when it moved is this count read, and the change marker
is the count.

The views read the devices, the slices, the released kernels and the kernels' reports of their
cells (``acct_activity``); while a request waits in the queue, also the figures its order (fair
share) and its expected start go by (``acct_kernels``, ``acct_decay``, ``acct_holds``), which a
fold does change. A trigger on each of those tables bumps the count in the very transaction
that writes it, so no code path can forget to, and a ledger shared with an earlier release
counts that release's writes too. The cost: one more 1 KiB page written per such commit.
"""

from __future__ import annotations

import sqlite3

from jupyter_gpushare.backends.accounting.schema import create_triggers

TABLE = """
CREATE TABLE IF NOT EXISTS view_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
)
"""

# What the views show, always; and what they show only of a queued request.
SHOWN = ("devices", "slices", "released", "acct_activity")
SHOWN_WHILE_QUEUED = ("acct_kernels", "acct_decay", "acct_holds")
_QUEUED = "EXISTS (SELECT 1 FROM slices WHERE state = 'queued')"


def _triggers() -> str:
    statements = []
    for table in SHOWN + SHOWN_WHILE_QUEUED:
        when = f"WHEN {_QUEUED} " if table in SHOWN_WHILE_QUEUED else ""
        for change in ("INSERT", "UPDATE", "DELETE"):
            statements.append(
                f"CREATE TRIGGER IF NOT EXISTS view_{table}_{change.lower()} AFTER {change} ON {table} "
                f"{when}BEGIN UPDATE view_version SET version = version + 1; END;"
            )
    return "\n".join(statements)


TRIGGERS = _triggers()


def create(db: sqlite3.Connection) -> None:
    """Create the count and its triggers where missing, inside the caller's transaction (after
    the ledger's and the accounting's tables: the triggers are on them)."""
    db.execute(TABLE)
    db.execute("INSERT OR IGNORE INTO view_version (id, version) VALUES (1, 0)")
    create_triggers(db, TRIGGERS)


def read(db: sqlite3.Connection) -> int:
    """The views' version now (one row)."""
    return int(db.execute("SELECT version FROM view_version").fetchone()[0])


__all__ = ["SHOWN", "SHOWN_WHILE_QUEUED", "TRIGGERS", "create", "read"]
