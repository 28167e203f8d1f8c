"""The ledger's tables, and how a ledger file is started or given back its rows (sqlite, no policy).

Used by :mod:`jupyter_gpushare.backends.local.ledger.access` when it creates, adopts or restores a
ledger file, and by :mod:`jupyter_gpushare.backends.local.ledger` for its queries.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from jupyter_gpushare.backends import accounting
from jupyter_gpushare.backends.local.ledger import view_version
from jupyter_gpushare.backends.local.ledger.lock import unlock
from jupyter_gpushare.core.devices import Device, MigInstance
from jupyter_gpushare.core.records import ProcessIdentity, ReleasedSlice, SliceRecord, SuspendedState

T = TypeVar("T")

SCHEMA_VERSION = 5  # 5: the views' version (view_version.py)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    uuid TEXT PRIMARY KEY,
    idx INTEGER NOT NULL,
    name TEXT NOT NULL,
    memory_total INTEGER NOT NULL,
    mig TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    memory_used INTEGER,
    utilization INTEGER,
    sampled_at REAL
);
CREATE TABLE IF NOT EXISTS slices (
    kernel_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running')),
    owner TEXT NOT NULL,
    server_id TEXT NOT NULL,
    kernel_name TEXT NOT NULL DEFAULT '',
    path TEXT NOT NULL DEFAULT '',
    mode TEXT NOT NULL,
    kind TEXT NOT NULL,  -- the slice's placement (core.records.STORED_PLACEMENT)
    size TEXT NOT NULL,
    cores INTEGER,
    device_uuid TEXT,
    unit_uuid TEXT,
    memory INTEGER NOT NULL DEFAULT 0,
    whole_card INTEGER NOT NULL DEFAULT 0,
    holder_pid INTEGER NOT NULL,
    holder_start REAL NOT NULL,
    kernel_pid INTEGER,
    kernel_start REAL,
    requested_at REAL NOT NULL,
    placed_at REAL,
    token_hash TEXT,
    memory_used INTEGER,
    utilization INTEGER,
    usage_source TEXT,
    usage_at REAL,  -- when the usage last changed
    warnings TEXT NOT NULL DEFAULT '[]',
    only_devices TEXT  -- JSON list of the device UUIDs it may be placed on (NULL: any)
);
CREATE INDEX IF NOT EXISTS slices_by_state ON slices (state, seq);
-- A slice its kernel gave back: the kernel's token digest, name and path, so that only that
-- kernel may take a slice under its id again, and its name and path come back with it, the
-- memory its processes still hold on the device (kept reserved), and its suspended GPU state.
CREATE TABLE IF NOT EXISTS released (
    kernel_id TEXT PRIMARY KEY,
    token_hash TEXT,
    kernel_name TEXT NOT NULL DEFAULT '',
    path TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL,
    start REAL NOT NULL,
    released_at REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    device_uuid TEXT,
    unit_uuid TEXT,
    held INTEGER NOT NULL DEFAULT 0,
    held_source TEXT,
    suspended TEXT  -- JSON of the suspended state (NULL when not suspended)
);
"""

# Columns added after schema version 1; a ledger file made by an older release gains them.
ADDED_COLUMNS = (
    ("devices", "memory_used", "INTEGER"),
    ("devices", "utilization", "INTEGER"),
    ("devices", "sampled_at", "REAL"),
    ("slices", "token_hash", "TEXT"),
    ("slices", "memory_used", "INTEGER"),
    ("slices", "utilization", "INTEGER"),
    ("slices", "usage_source", "TEXT"),
    ("slices", "usage_at", "REAL"),
    ("slices", "warnings", "TEXT NOT NULL DEFAULT '[]'"),
    ("slices", "only_devices", "TEXT"),
    ("released", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("released", "device_uuid", "TEXT"),
    ("released", "unit_uuid", "TEXT"),
    ("released", "held", "INTEGER NOT NULL DEFAULT 0"),
    ("released", "held_source", "TEXT"),
    ("released", "suspended", "TEXT"),
    ("released", "attached", "INTEGER NOT NULL DEFAULT 1"),  # pid/start are the kernel's own
)

DEVICE_COLUMNS = ("uuid", "idx", "name", "memory_total", "mig", "simulated")

Row = Mapping[str, Any]


# A ledger's rows are small, and a kernel's start or end changes five to seven pages (a slice,
# its three indexes, an accounting event, at times the header): each is a whole frame in the
# write-ahead log, so 1 KiB pages write a quarter of what sqlite's default 4 KiB pages do, and
# a checkpoint has a quarter as much to sync. Reading a hundred or a thousand slices costs the
# same either way (benchmarks/ledger_throughput.py, docs/benchmarks.md).
PAGE_SIZE = 1024


def new_database() -> sqlite3.Connection:
    """An empty database in memory, in the ledger's page size, for a ledger started afresh (it
    is copied to the file whole, page size included)."""
    database = sqlite3.connect(":memory:", isolation_level=None)
    database.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before anything is written: it then stays
    return database


def initialise(db: sqlite3.Connection, ledger_id: str | None) -> str:
    """Create what is missing (tables, columns, the ledger's id) inside the caller's
    transaction; returns the ledger's id (the file's own when it has one)."""
    for statement in filter(str.strip, SCHEMA.split(";")):
        db.execute(statement)
    for table, column, declaration in ADDED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    accounting.create(db)  # its tables, and the triggers on ours that record every change
    view_version.create(db)  # after both: its triggers are on ours and on the accounting's
    db.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
    )
    existing = ledger_id_of(db)
    if existing is not None:
        return existing
    assert ledger_id is not None
    db.execute("INSERT INTO meta (key, value) VALUES ('ledger_id', ?)", (ledger_id,))
    return ledger_id


def forget_an_earlier_boot(db: sqlite3.Connection, boot_id: str | None) -> int:
    """Drop every slice, queued request and released kernel of the machine's previous boot,
    inside the caller's transaction, and note this boot; how many slices and requests went.

    Processes are named by pid and start, both counted from boot: after a restart a new process
    can carry the very identity of one that held a slice, which would then stay held for as long
    as that stranger runs. No process of an earlier boot runs any more. (A ledger that never
    noted a boot, from an older release, is left to the usual liveness checks.)"""
    if boot_id is None:
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'boot_id'").fetchone()
    if row is not None and row[0] == boot_id:
        return 0
    gone = 0
    if row is not None:
        gone = db.execute("DELETE FROM slices").rowcount
        db.execute("DELETE FROM released")
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('boot_id', ?)", (boot_id,))
    return gone


def ledger_id_of(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'ledger_id'").fetchone()
    return str(row[0]) if row else None


@contextlib.contextmanager
def write_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` on a connection of the access layer's own (no file lock:
    its callers hold the lock file's note)."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def finish_transaction(
    connection: sqlite3.Connection, lock: int, work: Callable[[sqlite3.Connection], T]
) -> T:
    """Run ``work`` in the transaction begun on ``connection`` under the file ``lock``, commit
    (roll back if anything raises), and let go of the lock."""
    try:
        result = work(connection)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        unlock(lock)
        raise
    try:
        connection.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        raise
    finally:
        unlock(lock)
    return result


def ledger_id_of_safe(db: sqlite3.Connection) -> str | None:
    """The file's ledger id, or None for a file without the table yet."""
    try:
        return ledger_id_of(db)
    except sqlite3.OperationalError:
        return None


_SELECT_DEVICES = f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices ORDER BY idx"


def replace_devices(db: sqlite3.Connection, rows: Iterable[Row]) -> bool:
    """Make the devices table exactly ``rows``; False (and no write) when it already is."""
    wanted = [tuple(row[column] for column in DEVICE_COLUMNS) for row in rows]
    if [tuple(row) for row in db.execute(_SELECT_DEVICES)] == wanted:
        return False
    db.execute("DELETE FROM devices")
    db.executemany(
        f"INSERT INTO devices ({', '.join(DEVICE_COLUMNS)}) VALUES ({', '.join('?' * len(DEVICE_COLUMNS))})",
        wanted,
    )
    return True


def record_again(db: sqlite3.Connection, rows: Iterable[Row]) -> int:
    """Insert slice rows a process remembers into a ledger that lacks them; returns how many.

    A row whose kernel is already there is left alone; a running row is skipped where it would
    share a card with a whole-card slice (never two holders of one card).
    """
    added = 0
    for row in rows:
        if db.execute("SELECT 1 FROM slices WHERE kernel_id = ?", (row["kernel_id"],)).fetchone():
            continue
        if row["state"] == "running" and _card_conflict(db, row):
            continue
        values = dict(row)
        if db.execute("SELECT 1 FROM slices WHERE seq = ?", (values["seq"],)).fetchone():
            values["seq"] = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM slices").fetchone()[0]
        columns = [name for name in values if name in _SLICE_COLUMNS]
        db.execute(
            f"INSERT INTO slices ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            [values[name] for name in columns],
        )
        added += 1
    return added


def _card_conflict(db: sqlite3.Connection, row: Row) -> bool:
    others = db.execute(
        "SELECT whole_card FROM slices WHERE state = 'running' AND device_uuid = ?", (row["device_uuid"],)
    ).fetchall()
    return any(other[0] for other in others) or (bool(row["whole_card"]) and bool(others))


# The slices table's columns in the order of the schema above: every query that makes records
# names them (``SELECT *`` would follow the file's own order, which differs in a ledger an older
# release made and this one gave its added columns).
SLICE_COLUMNS: tuple[str, ...] = tuple(
    line.split()[0]
    for line in SCHEMA.split("CREATE TABLE IF NOT EXISTS slices (")[1].split(");")[0].splitlines()
    if line.strip() and not line.strip().startswith("--")
)
_SLICE_COLUMNS = frozenset(SLICE_COLUMNS)


def slice_rows(
    db: sqlite3.Connection, where: str = "", parameters: tuple[Any, ...] = (), also: str = ""
) -> list[tuple[Any, ...]]:
    """Rows of ``slices`` as plain tuples in :data:`SLICE_COLUMNS` order (``where``: the rest of
    the statement; ``also``: an expression whose value follows the columns). Plain tuples because
    :class:`sqlite3.Row`'s lookups by name cost more than everything else in reading a hundred
    rows."""
    cursor = db.cursor()
    cursor.row_factory = None
    columns = f"{', '.join(SLICE_COLUMNS)}, {also}" if also else ", ".join(SLICE_COLUMNS)
    return cursor.execute(f"SELECT {columns} FROM slices {where}", parameters).fetchall()


# ---- rows as records --------------------------------------------------------------------------------


def read_devices(db: sqlite3.Connection) -> list[Device]:
    """The registered devices with their sampled usage (read in every placement)."""
    return [_device(row) for row in _device_rows(db)]


def slice_dicts(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows in :data:`SLICE_COLUMNS` order as mappings (what :func:`record_again` takes)."""
    return [dict(zip(SLICE_COLUMNS, row, strict=True)) for row in rows]


def device_table(db: sqlite3.Connection) -> tuple[list[Device], list[dict[str, Any]]]:
    """The registered devices with their sampled usage, and their rows as registered (what
    :func:`replace_devices` takes), from one query."""
    rows = _device_rows(db)
    registered = [dict(zip(DEVICE_COLUMNS, row[: len(DEVICE_COLUMNS)], strict=True)) for row in rows]
    return [_device(row) for row in rows], registered


def _device_rows(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
    cursor = db.cursor()
    cursor.row_factory = None
    return cursor.execute(_SELECT_SAMPLED_DEVICES).fetchall()


_SELECT_SAMPLED_DEVICES = (
    f"SELECT {', '.join(DEVICE_COLUMNS)}, memory_used, utilization FROM devices ORDER BY idx"
)


@functools.lru_cache(maxsize=256)
def _device(row: tuple[Any, ...]) -> Device:
    # Read in every placement and every view: a row seen before (the pool rarely changes, its
    # usage once a sampling round) keeps its Device, and its MIG list is parsed once.
    uuid, index, name, memory_total, mig, _simulated, memory_used, utilization = row
    return Device(
        index=index,
        uuid=uuid,
        name=name,
        memory_total=memory_total,
        mig=tuple(MigInstance(*instance) for instance in json.loads(mig)),
        memory_used=memory_used,
        utilization=utilization,
    )


def record_of(row: Sequence[Any]) -> SliceRecord:
    """A slice record from a row in :data:`SLICE_COLUMNS` order (see :func:`slice_rows`)."""
    (
        kernel_id,
        seq,
        state,
        owner,
        server_id,
        kernel_name,
        path,
        mode,
        placement,
        size,
        cores,
        device_uuid,
        unit_uuid,
        memory,
        whole_card,
        holder_pid,
        holder_start,
        kernel_pid,
        kernel_start,
        requested_at,
        placed_at,
        token_hash,
        memory_used,
        utilization,
        usage_source,
        usage_at,
        warnings,
        _only_devices,
    ) = row
    return SliceRecord(
        kernel_id,
        seq,
        state,
        owner,
        server_id,
        kernel_name,
        path,
        mode,
        placement,
        size,
        cores,
        device_uuid,
        unit_uuid,
        memory,
        bool(whole_card),
        ProcessIdentity(holder_pid, holder_start),
        ProcessIdentity(kernel_pid, kernel_start) if kernel_pid is not None else None,
        requested_at,
        placed_at,
        token_hash,
        memory_used,
        utilization,
        usage_source,
        usage_at,
        tuple(json.loads(warnings)) if warnings not in (None, "[]") else (),
    )


def only_devices_of(row: Sequence[Any]) -> list[str] | None:
    """The device UUIDs a row in :data:`SLICE_COLUMNS` order may be placed on (None: any)."""
    only = row[_ONLY_DEVICES]
    return None if only is None else list(json.loads(only))


_ONLY_DEVICES = SLICE_COLUMNS.index("only_devices")


def insert_released(db: sqlite3.Connection, released: ReleasedSlice) -> None:
    """Write (or replace) what a kernel left when it gave its slice back."""
    suspended = released.suspended
    db.execute(
        """INSERT OR REPLACE INTO released (kernel_id, token_hash, kernel_name, path, pid, start,
           released_at, owner, device_uuid, unit_uuid, held, held_source, suspended, attached)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (
            released.kernel_id,
            released.token_hash,
            released.kernel_name,
            released.path,
            released.process.pid,
            released.process.start,
            time.time(),
            released.owner,
            released.device_uuid,
            released.unit_uuid,
            released.held,
            released.held_source,
            None if suspended is None else json.dumps(suspended.as_json()),
            int(released.attached),
        ),
    )


def released_of(row: sqlite3.Row) -> ReleasedSlice:
    suspended = row["suspended"]
    return ReleasedSlice(
        kernel_id=row["kernel_id"],
        token_hash=row["token_hash"],
        kernel_name=row["kernel_name"],
        path=row["path"],
        process=ProcessIdentity(row["pid"], row["start"]),
        owner=row["owner"],
        device_uuid=row["device_uuid"],
        unit_uuid=row["unit_uuid"],
        held=row["held"],
        held_source=row["held_source"],
        suspended=SuspendedState.from_json(json.loads(suspended)) if suspended else None,
        attached=bool(row["attached"]),
    )
