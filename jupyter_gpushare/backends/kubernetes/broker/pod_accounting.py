"""The Kubernetes broker's accounting: what every user's kernel pods reserved, used and waited.

The broker sees every kernel pod (its list+watch), the starts waiting in its own queue, and what
the kernels report of their use (their servers pass it on). Every housekeeping round (a few
seconds) it writes what it sees into the ``slices`` table of an sqlite file of its own
(``c.GPUShareBroker.accounting_path``; mode 0600: only the broker opens it) — only what changed
(:func:`~jupyter_gpushare.backends.kubernetes.objects.accounted.changes`) — and the accounting's
triggers, the node ledger's own (:mod:`jupyter_gpushare.backends.accounting.schema`), record the
events that :class:`~jupyter_gpushare.backends.accounting.accounts.Accounts` folds into the
figures ``GET usage``, ``jupyter gpushare report`` and the Prometheus counters show, with the
same names and the same rule of who sees what as on a team box. So a hold is known to the round
(``HOUSEKEEPING_EVERY`` of the broker) — or to a kernel's first cell report, which writes its own
kernel first (:meth:`PodAccounting.look_at`) — and a broker restarted finds its rows and goes on.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from jupyter_gpushare.backends.accounting import schema, store
from jupyter_gpushare.backends.accounting.accounts import Accounts
from jupyter_gpushare.backends.kubernetes.objects.accounted import Accounted, Changes, changes
from jupyter_gpushare.core.errors import LedgerError
from jupyter_gpushare.core.placement.wait_estimate import History

if TYPE_CHECKING:
    from jupyter_gpushare.config import GPUShare

log = logging.getLogger("jupyter_gpushare.broker")

T = TypeVar("T")
BUSY_TIMEOUT = 10.0  # seconds a write waits for another (a report folding) before it fails

# The slices the broker sees, with the columns the accounting's triggers read.
SLICES = """
CREATE TABLE IF NOT EXISTS slices (
    kernel_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    memory INTEGER NOT NULL,
    memory_used INTEGER,
    usage_at REAL,
    placed_at REAL,
    requested_at REAL,
    path TEXT NOT NULL DEFAULT '',
    kernel_name TEXT NOT NULL DEFAULT ''
)
"""
# The node ledger's kernels that gave their slice back and live on, which the accounting's
# roll-up and activity read beside ``slices``: a pod never gives its slice back while its kernel
# lives (it restarts into a new pod), so here it stays empty.
RELEASED = "CREATE TABLE IF NOT EXISTS released (kernel_id TEXT PRIMARY KEY, owner TEXT NOT NULL)"


COLUMNS = {"kernel_id", "owner", "state", "memory", "memory_used", "usage_at", "placed_at", "requested_at"}


class AccountingFile:
    """The broker's sqlite file: a connection per thread, one write transaction at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        path.parent.mkdir(parents=True, exist_ok=True)
        # The file holds every user's figures: the broker's alone, whatever its umask.
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(descriptor)
        os.chmod(path, 0o600)
        self.write_with(_create)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            self._local.connection = connection
        return connection

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction; sqlite's errors (a locked, unreadable or foreign file) said as the
        accounting's, naming the file."""
        connection: sqlite3.Connection | None = None
        try:
            connection = self._connection()
            connection.execute(begin)
            yield connection
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            if connection is not None and connection.in_transaction:
                connection.execute("ROLLBACK")
            raise LedgerError(f"the broker's accounting file {self.path}: {error}") from error
        except BaseException:
            if connection is not None and connection.in_transaction:
                connection.execute("ROLLBACK")
            raise

    def write_with(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._transaction("BEGIN IMMEDIATE") as connection:
            return work(connection)

    def read_with(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._transaction("BEGIN") as connection:
            return work(connection)


class PodAccounting(Accounts):
    """The accounting of the kernel pods one broker sees (one per broker)."""

    ledger: AccountingFile

    def __init__(self, path: Path, settings: Callable[[], GPUShare]) -> None:
        super().__init__(AccountingFile(path), settings)
        self._rows = self.ledger.read_with(_rows)  # as the file shows them: a restart goes on
        self._lock = threading.Lock()
        # One kernel as the broker sees it now (its pod starts' accounted_one), for look_at.
        self.seen_one: Callable[[str], Accounted | None] | None = None

    @property
    def path(self) -> Path:
        return self.ledger.path

    def look(self, seen: Callable[[], dict[str, Accounted]]) -> int:
        """Write what the broker sees now (``seen()``, taken under this file's lock: two looks
        never write out of order) where it differs from the file's rows; returns how many rows
        changed."""
        with self._lock:
            now = seen()
            count = self._write(changes(self._rows, now))
            self._rows = dict(now)
            return count

    def look_at(self, kernel_id: str) -> None:
        """The same for one kernel, as :attr:`seen_one` shows it now (a kernel's cell report
        comes: its placement is written first, so the report finds its hold)."""
        if self.seen_one is None:
            return
        with self._lock:
            new, old = self.seen_one(kernel_id), self._rows.get(kernel_id)
            self._write(changes({kernel_id: old} if old else {}, {kernel_id: new} if new else {}))
            if new is None:
                self._rows.pop(kernel_id, None)
            else:
                self._rows[kernel_id] = new

    def note_activity(
        self, kernel_id: str, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> bool:
        self.look_at(kernel_id)
        return super().note_activity(kernel_id, busy, at, idle_after, idle_action)

    def estimate_basis(self) -> tuple[History, set[str], dict[str, float]]:
        """What the wait estimates of Kueue's queues go by (:mod:`.kueue_waits`): the finished holds
        and the judged estimates, the kernels whose first estimates are kept, and when each
        running kernel pod was placed (seconds since the epoch). Folds what ended since the
        last fold first: its holds count."""
        self.fold()

        def read(db: sqlite3.Connection) -> tuple[History, set[str], dict[str, float]]:
            placed = db.execute("SELECT kernel_id, placed_at FROM slices WHERE placed_at IS NOT NULL")
            return store.history(db), store.kept_estimates(db), {row[0]: row[1] for row in placed}

        return self.ledger.read_with(read)

    def keep_estimates(self, kept: Mapping[str, tuple[float, float]]) -> None:
        """Keep waiting kernels' first estimates (the model's, the naive one), judged once each
        kernel's pod is placed (the accounting's triggers). Each kernel's wait is written first
        (:meth:`look_at`): a pod gated since the last round has its row, and its first estimates
        are the ones kept."""
        for kernel_id in kept:
            self.look_at(kernel_id)
        self.ledger.write_with(lambda db: store.keep_estimates(db, kept))

    def _write(self, wanted: Changes) -> int:
        """Write ``wanted`` (lock held); how many rows changed."""
        if not wanted:
            return 0
        at = time.time()

        def write(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(k,) for k in wanted.gone])
            db.executemany(
                "INSERT INTO slices (kernel_id, owner, state, memory, memory_used, usage_at,"
                " placed_at, requested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        row.kernel_id,
                        row.owner,
                        row.state,
                        row.memory,
                        row.used,
                        at if row.used is not None else None,
                        at if row.state == "running" else None,
                        row.requested_at,
                    )
                    for row in wanted.added
                ],
            )
            db.executemany(
                "UPDATE slices SET state = 'running', placed_at = ?, memory = ?, memory_used = ?,"
                " usage_at = ? WHERE kernel_id = ?",
                [(at, row.memory, row.used, at, row.kernel_id) for row in wanted.placed],
            )
            db.executemany(
                "UPDATE slices SET memory = ? WHERE kernel_id = ?",
                [(row.memory, row.kernel_id) for row in wanted.resized],
            )
            db.executemany(
                "UPDATE slices SET memory_used = ?, usage_at = ? WHERE kernel_id = ?",
                [(row.used, at, row.kernel_id) for row in wanted.used],
            )

        self.ledger.write_with(write)
        return (
            len(wanted.added) + len(wanted.placed) + len(wanted.resized) + len(wanted.used) + len(wanted.gone)
        )


def _create(db: sqlite3.Connection) -> None:
    db.execute(SLICES)
    db.execute(RELEASED)
    columns = {row[1] for row in db.execute("PRAGMA table_info(slices)")}
    if not columns >= COLUMNS or "device_uuid" in columns:
        # A node ledger (its slices are a device's), or another program's file: never written.
        raise sqlite3.DatabaseError(
            "it is not a GPU broker's accounting file (a node ledger? c.GPUShareBroker.accounting_path "
            "must name a file of its own)"
        )
    schema.create(db, schema.SLICE_TRIGGERS)


def _rows(db: sqlite3.Connection) -> dict[str, Accounted]:
    return {
        row["kernel_id"]: Accounted(
            row["kernel_id"],
            row["owner"],
            row["state"],
            row["memory"],
            row["memory_used"],
            row["requested_at"],
        )
        for row in db.execute("SELECT * FROM slices")
    }


__all__ = ["AccountingFile", "PodAccounting"]
