"""The node ledger: every slice on this node, in one sqlite file shared by all its processes.

Each decision is one ``BEGIN IMMEDIATE`` transaction: the write lock is taken before anything is
read, so two processes can never both see the same free memory and both take it. Placement itself
is the pure :func:`jupyter_gpushare.allocator.fit`; this module only reads rows, asks, and writes.

A row belongs to a process: the kernel once it runs, before that the process that asked for it
(the server, ``jupyter console``, nbclient…). Reconciliation deletes rows whose process is gone,
comparing pid *and* start time so a reused pid does not keep a dead slice alive.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .allocator import Held, Placement, Policy, Refusal, Request, fit, fit_on_device
from .devices import Device, MigInstance
from .processes import is_alive
from .records import (
    DeviceSample,
    KernelSample,
    NewRequest,
    Outcome,
    Placed,
    ProcessIdentity,
    Refused,
    SliceRecord,
    Waiting,
)
from .sizes import parse_size

SCHEMA_VERSION = 2

_SCHEMA = """
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
    kind TEXT NOT NULL,
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
    warnings TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS slices_by_state ON slices (state, seq);
"""

# Columns added after schema version 1; a ledger file made by an older release gains them.
_ADDED_COLUMNS = (
    ("devices", "memory_used", "INTEGER"),
    ("devices", "utilization", "INTEGER"),
    ("devices", "sampled_at", "REAL"),
    ("slices", "token_hash", "TEXT"),
    ("slices", "memory_used", "INTEGER"),
    ("slices", "utilization", "INTEGER"),
    ("slices", "usage_source", "TEXT"),
    ("slices", "usage_at", "REAL"),
    ("slices", "warnings", "TEXT NOT NULL DEFAULT '[]'"),
)

LivenessCheck = Callable[[ProcessIdentity], bool]


class Ledger:
    """Access to one ledger file. Cheap to create; connections are cached per thread."""

    def __init__(self, path: str | os.PathLike[str], busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self._local = threading.local()
        self._initialised = False
        self._watcher: tuple[sqlite3.Connection, int] | None = None
        self._watcher_lock = threading.Lock()

    # ---- connection handling -------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        # A forked child must not reuse its parent's handle: sqlite forbids it.
        if connection is not None and getattr(self._local, "pid", None) == os.getpid():
            return connection
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout_ms / 1000)
        connection.row_factory = sqlite3.Row
        connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        if not self._initialised:
            # WAL lets readers (status, the panel) run while a writer decides; NORMAL sync is
            # durable against process crashes, which is what a ledger of live processes needs.
            connection.execute("PRAGMA journal_mode = WAL")
            with _transaction(connection):
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    connection.execute(statement)
                _add_missing_columns(connection)
                connection.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            self._initialised = True
        connection.execute("PRAGMA synchronous = NORMAL")
        self._local.connection = connection
        self._local.pid = os.getpid()
        return connection

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        connection = self._connection()
        # Writers queue on a blocking file lock before asking sqlite: the kernel wakes them in
        # turn, where sqlite's own busy handler sleeps and retries and lets one process starve
        # the others under contention.
        lock = self._lock_file()
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with _transaction(connection):
                yield connection
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    def _lock_file(self) -> int:
        descriptor: int | None = getattr(self._local, "lock", None)
        if descriptor is None or getattr(self._local, "lock_pid", None) != os.getpid():
            # The same permissions as the ledger itself (as sqlite does for its WAL files), so a
            # ledger shared by a group of users stays usable by all of them.
            try:
                mode = os.stat(self.path).st_mode & 0o666
            except OSError:
                mode = 0o600
            descriptor = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, mode)
            self._local.lock = descriptor
            self._local.lock_pid = os.getpid()
        return descriptor

    def change_marker(self) -> int:
        """A number that changes whenever anyone commits to the ledger (a few microseconds).

        Read on a connection of its own that never writes, so sqlite's ``data_version`` counts
        every commit — by other processes and by this process's other connections alike. One
        watcher for the whole process: each connection counts from its own start, so markers
        read on two connections (two threads) could repeat each other across a change.
        """
        with self._watcher_lock:
            if self._watcher is None or self._watcher[1] != os.getpid():
                self._connection()  # the file and schema exist before we watch them
                watcher = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                self._watcher = (watcher, os.getpid())
            return int(self._watcher[0].execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None and getattr(self._local, "pid", None) == os.getpid():
            connection.close()
        with self._watcher_lock:
            if self._watcher is not None and self._watcher[1] == os.getpid():
                self._watcher[0].close()
            self._watcher = None
        lock = getattr(self._local, "lock", None)
        if lock is not None and getattr(self._local, "lock_pid", None) == os.getpid():
            os.close(lock)
        self._local = threading.local()

    # ---- devices -------------------------------------------------------------------------

    def register_devices(self, devices: Sequence[Device], simulated: bool) -> None:
        """Record the pool this node has, so every reader (the CLI too) sees the same devices."""
        rows = [
            (
                device.uuid,
                device.index,
                device.name,
                device.memory_total,
                json.dumps([[m.uuid, m.profile, m.memory_total] for m in device.mig]),
                int(simulated),
            )
            for device in devices
        ]
        with self._write() as db:
            current = [
                tuple(row)
                for row in db.execute(
                    "SELECT uuid, idx, name, memory_total, mig, simulated FROM devices ORDER BY idx"
                )
            ]
            if current == rows:
                return
            db.execute("DELETE FROM devices")
            db.executemany(
                "INSERT INTO devices (uuid, idx, name, memory_total, mig, simulated)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    def devices(self) -> list[Device]:
        return _read_devices(self._connection())

    def simulated(self) -> bool:
        row = self._connection().execute("SELECT MAX(simulated) FROM devices").fetchone()
        return bool(row[0])

    # ---- slices --------------------------------------------------------------------------

    def records(self) -> list[SliceRecord]:
        rows = self._connection().execute("SELECT * FROM slices ORDER BY seq").fetchall()
        return [_record(row) for row in rows]

    def get(self, kernel_id: str) -> SliceRecord | None:
        row = self._connection().execute("SELECT * FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
        return _record(row) if row else None

    def enqueue(self, request: NewRequest) -> SliceRecord:
        """Add a queued request; a kernel that already has a row (a restart) keeps it."""
        with self._write() as db:
            record = _enqueue(db, request)
        assert record is not None
        return record

    def request(self, request: NewRequest, policy: Policy, alive: LivenessCheck = is_alive) -> Outcome:
        """Queue a request and try to place it in one transaction.

        A request that fits at once is never seen queued by anyone else, so concurrent starts on
        a free pool do not wait behind each other.
        """
        with self._write() as db:
            _enqueue(db, request, read_back=False)
            return _place(db, request.kernel_id, policy, alive)

    def try_place(self, kernel_id: str, policy: Policy, alive: LivenessCheck = is_alive) -> Outcome:
        """Place a queued request if it is first in line and fits; otherwise say why not.

        Strict FIFO: a request waits while an earlier one is queued, so a large request is
        never starved by a stream of small ones. A request behind a live one is answered from a
        read, without the write lock, so a long queue's polling does not slow everyone's writes.
        """
        connection = self._connection()
        connection.execute("BEGIN")  # one consistent snapshot for the counts below, no lock
        try:
            waiting = _waiting_behind(connection, kernel_id, alive)
        finally:
            connection.execute("COMMIT")
        if waiting is not None:
            return waiting
        with self._write() as db:
            return _place(db, kernel_id, policy, alive)

    def attach_kernel(self, kernel_id: str, kernel: ProcessIdentity | None) -> None:
        """Tie the slice to the kernel process (None: back to the holder, e.g. during a restart)."""
        with self._write() as db:
            db.execute(
                "UPDATE slices SET kernel_pid = ?, kernel_start = ? WHERE kernel_id = ?",
                (kernel.pid if kernel else None, kernel.start if kernel else None, kernel_id),
            )

    def resize(self, kernel_id: str, size: str, policy: Policy) -> Placement | Refusal:
        """Change a running slice's size in place (a live resize cannot move the kernel)."""
        parsed = parse_size(size)
        with self._write() as db:
            row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
            if row is None or row["state"] != "running":
                return Refusal(f"kernel {kernel_id} holds no GPU slice", retry=False)
            record = _record(row)
            assert record.device_uuid is not None
            if record.kind != "shared":
                return Refusal(f"a {record.mode} slice cannot be resized in place", retry=False)
            request = Request(kernel_id, record.owner, parsed, record.kind)
            outcome = fit_on_device(request, record.device_uuid, _read_devices(db), _held(db), policy)
            if isinstance(outcome, Placement):
                db.execute(
                    "UPDATE slices SET memory = ?, size = ?, whole_card = ? WHERE kernel_id = ?",
                    (outcome.memory, parsed.text, int(outcome.whole_card), kernel_id),
                )
        return outcome

    def release(self, kernel_id: str) -> SliceRecord | None:
        """Remove a kernel's slice or queued request; returns what was removed."""
        with self._write() as db:
            row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM slices WHERE kernel_id = ?", (kernel_id,))
        return _record(row)

    def reconcile(self, alive: LivenessCheck = is_alive) -> list[SliceRecord]:
        """Release every slice and queued request whose process is gone; returns them."""
        with self._write() as db:
            rows = [_record(row) for row in db.execute("SELECT * FROM slices").fetchall()]
            dead = [record for record in rows if not alive(record.process)]
            db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(r.kernel_id,) for r in dead])
        return dead

    def record_usage(
        self,
        kernel_samples: Sequence[KernelSample] = (),
        device_samples: Sequence[DeviceSample] = (),
    ) -> None:
        """Write one sampling round (usage and warnings) in a single transaction.

        A sample whose ``source`` is None carries warnings only: the usage stays as the kernel
        reported it, so a report made while the sampler ran is not overwritten.
        """
        # Rows are written only where a figure changed: a round that changes nothing leaves the
        # database as it was, so readers' caches (keyed on PRAGMA data_version) stay valid and
        # the REST API does not re-render every slice once per sampling round.
        now = time.time()
        with self._write() as db:
            db.executemany(
                """UPDATE slices SET memory_used = ?, utilization = ?, usage_source = ?,
                   usage_at = ?, warnings = ?
                   WHERE kernel_id = ? AND (memory_used IS NOT ? OR utilization IS NOT ?
                                            OR usage_source IS NOT ? OR warnings IS NOT ?)""",
                [
                    (
                        sample.memory_used,
                        sample.utilization,
                        sample.source,
                        now,
                        warnings,
                        sample.kernel_id,
                        sample.memory_used,
                        sample.utilization,
                        sample.source,
                        warnings,
                    )
                    for sample in kernel_samples
                    if sample.source is not None
                    for warnings in [json.dumps(list(sample.warnings))]
                ],
            )
            db.executemany(
                "UPDATE slices SET warnings = ? WHERE kernel_id = ? AND warnings IS NOT ?",
                [
                    (warnings, sample.kernel_id, warnings)
                    for sample in kernel_samples
                    if sample.source is None
                    for warnings in [json.dumps(list(sample.warnings))]
                ],
            )
            db.executemany(
                """UPDATE devices SET memory_used = ?, utilization = ?, sampled_at = ?
                   WHERE uuid = ? AND (memory_used IS NOT ? OR utilization IS NOT ?)""",
                [
                    (
                        sample.memory_used,
                        sample.utilization,
                        now,
                        sample.uuid,
                        sample.memory_used,
                        sample.utilization,
                    )
                    for sample in device_samples
                ],
            )

    def report_usage(self, kernel_id: str, memory_used: int, utilization: int | None, source: str) -> None:
        """A kernel's own report of its usage (simulated pools, or where NVML cannot see it)."""
        with self._write() as db:
            db.execute(
                """UPDATE slices SET memory_used = ?, utilization = ?, usage_source = ?, usage_at = ?
                   WHERE kernel_id = ?""",
                (memory_used, utilization, source, time.time(), kernel_id),
            )

    def queue_position(self, kernel_id: str) -> int | None:
        record = self.get(kernel_id)
        if record is None or record.state != "queued":
            return None
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            return _head_of_queue(connection, record.seq)[0] + 1
        finally:
            connection.execute("COMMIT")


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _add_missing_columns(db: sqlite3.Connection) -> None:
    for table, column, declaration in _ADDED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


def _read_devices(db: sqlite3.Connection) -> list[Device]:
    return [
        Device(
            index=row["idx"],
            uuid=row["uuid"],
            name=row["name"],
            memory_total=row["memory_total"],
            mig=tuple(MigInstance(*instance) for instance in json.loads(row["mig"])),
            memory_used=row["memory_used"],
            utilization=row["utilization"],
        )
        for row in db.execute("SELECT * FROM devices ORDER BY idx")
    ]


def _record(row: sqlite3.Row) -> SliceRecord:
    kernel = (
        ProcessIdentity(row["kernel_pid"], row["kernel_start"]) if row["kernel_pid"] is not None else None
    )
    return SliceRecord(
        kernel_id=row["kernel_id"],
        seq=row["seq"],
        state=row["state"],
        owner=row["owner"],
        server_id=row["server_id"],
        kernel_name=row["kernel_name"],
        path=row["path"],
        mode=row["mode"],
        kind=row["kind"],
        size=row["size"],
        cores=row["cores"],
        device_uuid=row["device_uuid"],
        unit_uuid=row["unit_uuid"],
        memory=row["memory"],
        whole_card=bool(row["whole_card"]),
        holder=ProcessIdentity(row["holder_pid"], row["holder_start"]),
        kernel=kernel,
        requested_at=row["requested_at"],
        placed_at=row["placed_at"],
        token_hash=row["token_hash"],
        memory_used=row["memory_used"],
        utilization=row["utilization"],
        usage_source=row["usage_source"],
        usage_at=row["usage_at"],
        warnings=tuple(json.loads(row["warnings"])) if row["warnings"] not in (None, "[]") else (),
    )


def _running(db: sqlite3.Connection) -> list[SliceRecord]:
    return [_record(row) for row in db.execute("SELECT * FROM slices WHERE state = 'running'")]


def _held(db: sqlite3.Connection) -> list[Held]:
    # Only the columns placement needs: this runs in every placement, under the write lock.
    rows = db.execute(
        "SELECT kernel_id, owner, device_uuid, unit_uuid, memory, whole_card FROM slices"
        " WHERE state = 'running'"
    ).fetchall()
    return [Held(row[0], row[1], row[2], row[3], row[4], bool(row[5])) for row in rows]


def _enqueue(db: sqlite3.Connection, request: NewRequest, read_back: bool = True) -> SliceRecord | None:
    existing = db.execute("SELECT kernel_id FROM slices WHERE kernel_id = ?", (request.kernel_id,)).fetchone()
    if existing:
        db.execute(
            "UPDATE slices SET holder_pid = ?, holder_start = ?,"
            " token_hash = COALESCE(?, token_hash) WHERE kernel_id = ?",
            (request.holder.pid, request.holder.start, request.token_hash, request.kernel_id),
        )
    else:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM slices").fetchone()[0]
        db.execute(
            """INSERT INTO slices (kernel_id, seq, state, owner, server_id, kernel_name,
               path, mode, kind, size, cores, holder_pid, holder_start, requested_at,
               token_hash)
               VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                request.kernel_id,
                seq,
                request.owner,
                request.server_id,
                request.kernel_name,
                request.path,
                request.mode,
                request.kind,
                request.size,
                request.cores,
                request.holder.pid,
                request.holder.start,
                time.time(),
                request.token_hash,
            ),
        )
    if not read_back:
        return None
    row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (request.kernel_id,)).fetchone()
    return _record(row)


def _head_of_queue(db: sqlite3.Connection, before_seq: int) -> tuple[int, SliceRecord | None]:
    """How many queued requests are ahead of ``before_seq``, and the first of them."""
    count = db.execute(
        "SELECT COUNT(*) FROM slices WHERE state = 'queued' AND seq < ?", (before_seq,)
    ).fetchone()[0]
    if not count:
        return 0, None
    row = db.execute(
        "SELECT * FROM slices WHERE state = 'queued' AND seq < ? ORDER BY seq LIMIT 1", (before_seq,)
    ).fetchone()
    return int(count), _record(row)


def _waiting(ahead: int) -> Waiting:
    plural = "s" if ahead > 1 else ""
    return Waiting(ahead + 1, f"behind {ahead} earlier GPU request{plural}")


def _waiting_behind(db: sqlite3.Connection, kernel_id: str, alive: LivenessCheck) -> Waiting | None:
    """Waiting, read without a lock, when a live request is ahead; None when a write must decide."""
    row = db.execute("SELECT state, seq FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
    if row is None or row["state"] != "queued":
        return None
    ahead, head = _head_of_queue(db, row["seq"])
    if head is None or not alive(head.process):
        return None
    return _waiting(ahead)


def _place(db: sqlite3.Connection, kernel_id: str, policy: Policy, alive: LivenessCheck) -> Outcome:
    row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
    if row is None:
        raise LookupError(f"no GPU request for kernel {kernel_id} in the ledger")
    record = _record(row)
    if record.state == "running":
        return Placed(record)
    ahead, head = _head_of_queue(db, record.seq)
    # Only the head of the queue is checked for life: dead requests behind it are dropped when
    # they reach the head, so each poll costs one process check, not one per waiter.
    while head is not None and not alive(head.process):
        db.execute("DELETE FROM slices WHERE kernel_id = ?", (head.kernel_id,))
        ahead, head = _head_of_queue(db, record.seq)
    if ahead:
        return _waiting(ahead)
    request = Request(kernel_id, record.owner, parse_size(record.size), record.kind)
    devices = _read_devices(db)
    outcome = fit(request, devices, _held(db), policy)
    if isinstance(outcome, Refusal) and outcome.retry and _release_dead(db, alive, _running(db)):
        outcome = fit(request, devices, _held(db), policy)
    if isinstance(outcome, Refusal):
        # Retry-able: first in line, waiting for memory. Otherwise waiting cannot help.
        return Waiting(1, outcome.reason) if outcome.retry else Refused(outcome.reason)
    placed_at = time.time()
    db.execute(
        """UPDATE slices SET state = 'running', device_uuid = ?, unit_uuid = ?, memory = ?,
           whole_card = ?, placed_at = ? WHERE kernel_id = ?""",
        (
            outcome.device_uuid,
            outcome.unit_uuid,
            outcome.memory,
            int(outcome.whole_card),
            placed_at,
            kernel_id,
        ),
    )
    return Placed(
        dataclasses.replace(
            record,
            state="running",
            device_uuid=outcome.device_uuid,
            unit_uuid=outcome.unit_uuid,
            memory=outcome.memory,
            whole_card=outcome.whole_card,
            placed_at=placed_at,
        )
    )


def _release_dead(db: sqlite3.Connection, alive: LivenessCheck, records: Sequence[SliceRecord]) -> bool:
    dead = [record.kernel_id for record in records if not alive(record.process)]
    db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(kernel_id,) for kernel_id in dead])
    return bool(dead)
