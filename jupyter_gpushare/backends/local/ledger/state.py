"""The whole ledger as one read saw it, read once per change and shared by the process's readers.

``GET pool``, ``GET kernels``, the stream and the sampler all look at every slice, once a second
or on every request. They share one :class:`~jupyter_gpushare.core.records.LedgerState` until the
next commit that changes what they show (the change marker says when: :mod:`.view_version`), and
a read after a change turns only the rows that changed into records: a row equal to one of the
last read keeps its record (records are frozen, so sharing them is safe).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

from jupyter_gpushare.backends.local.ledger.file import current_pid
from jupyter_gpushare.backends.local.ledger.schema import (
    Row,
    device_table,
    record_of,
    released_of,
    slice_rows,
)
from jupyter_gpushare.core.records import LedgerState, SliceRecord

SliceRow = tuple[Any, ...]


class StateCache:
    """The latest state of one ledger in this process, and the records of its rows."""

    def __init__(self) -> None:
        self._latest: tuple[int, LedgerState] | None = None
        self._records: dict[str, tuple[SliceRow, SliceRecord]] = {}  # by kernel id, as last read
        self._lock = threading.Lock()  # one reader renews it; the others wait for its read
        self._pid = current_pid()

    def latest(self, marker: int) -> LedgerState | None:
        latest = self._latest
        return latest[1] if latest is not None and latest[0] == marker else None

    def read(
        self, connection: sqlite3.Connection, marker: int
    ) -> tuple[LedgerState, Sequence[Row] | None, Sequence[SliceRow] | None]:
        """The state for ``marker`` (read before the rows: a commit in between only renews it once
        more), and the device and slice rows if they were read now (for the access to remember)."""
        if self._pid != current_pid():
            # A forked child: its parent's lock may have been held by a thread it does not have.
            self._lock, self._pid = threading.Lock(), current_pid()
        with self._lock:
            latest = self.latest(marker)
            if latest is not None:  # read by another thread while this one waited
                return latest, None, None
            connection.execute("BEGIN")  # one snapshot of the three tables, no lock
            try:
                devices, devices_table = device_table(connection)
                rows = slice_rows(connection, "ORDER BY seq")
                released = connection.execute("SELECT * FROM released ORDER BY released_at").fetchall()
            finally:
                connection.execute("COMMIT")
            known = self._records
            records = tuple(_record(row, known.get(row[0])) for row in rows)
            self._records = {row[0]: (row, record) for row, record in zip(rows, records, strict=True)}
            state = LedgerState(
                devices=tuple(devices),
                slices=records,
                released=tuple(released_of(row) for row in released),
                simulated=any(row["simulated"] for row in devices_table),
            )
            self._latest = (marker, state)
        return state, devices_table, rows


def _record(row: SliceRow, known: tuple[SliceRow, SliceRecord] | None) -> SliceRecord:
    """The record of ``row``: the one made last time when the row is the same."""
    if known is not None and known[0] == row:
        return known[1]
    return record_of(row)
