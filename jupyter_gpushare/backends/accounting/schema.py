"""The accounting's tables in the node ledger's file (or the Kubernetes broker's), and the
triggers that feed them (sqlite).

Every change of a slice is recorded by the ledger's own tables: a trigger on ``slices`` and
``released`` appends an event to ``acct_events`` in the very transaction that makes the change.
No code path that queues, places, resizes, releases or suspends a slice can forget to account
for it, and the request/release path pays one small insert. The events are folded into figures
later (:mod:`.store`), outside the path of a start.
"""

from __future__ import annotations

import sqlite3

from jupyter_gpushare.core.placement.wait_estimate import JUDGED

# Seconds since the epoch, as sqlite tells the time (to the millisecond).
NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_EVENT = (
    "INSERT INTO acct_events (at, kernel_id, owner, what, memory, used, path, requested_at, kernel_name)"
    " VALUES"
)

FIGURE_COLUMNS = (
    "reserved",
    "used",
    "busy",
    "idle",
    "suspended",
    "queued",
    "wait",
    "starts",
    "suspends",
    "resumes",
)
_FIGURES = ",\n    ".join(f"{name} REAL NOT NULL DEFAULT 0" for name in FIGURE_COLUMNS)

TABLES = f"""
-- The file's notes (the node ledger has it too): when the accounting last rolled up.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS acct_events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    kernel_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    what TEXT NOT NULL,
    memory INTEGER,
    used INTEGER,
    path TEXT NOT NULL DEFAULT '',
    requested_at REAL,
    kernel_name TEXT NOT NULL DEFAULT ''
);
-- What each kernel is doing now, accounted up to ``since`` (tally.KernelAccount).
CREATE TABLE IF NOT EXISTS acct_kernels (
    kernel_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    path TEXT NOT NULL,
    phase TEXT NOT NULL,
    since REAL NOT NULL,
    memory INTEGER NOT NULL,
    used INTEGER NOT NULL,
    busy INTEGER NOT NULL,
    queued_at REAL,
    placed_at REAL,
    resuming INTEGER NOT NULL,
    released INTEGER NOT NULL,
    kernel_name TEXT NOT NULL DEFAULT '',
    started_at REAL
);
-- Figures per kernel and 15 minutes; per user and hour (kernel_id '') after the retention.
CREATE TABLE IF NOT EXISTS acct_usage (
    start REAL NOT NULL,
    width REAL NOT NULL,
    kernel_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    {_FIGURES},
    PRIMARY KEY (start, kernel_id, owner)
);
CREATE INDEX IF NOT EXISTS acct_usage_by_owner ON acct_usage (owner, start);
-- Every user's figures since accounting began (monotonic: the Prometheus counters).
CREATE TABLE IF NOT EXISTS acct_totals (
    owner TEXT PRIMARY KEY,
    {_FIGURES}
);
-- Each user's reserved byte-seconds, decayed, as of ``at`` (fair share).
CREATE TABLE IF NOT EXISTS acct_decay (
    owner TEXT PRIMARY KEY,
    value REAL NOT NULL,
    at REAL NOT NULL,
    half_life REAL NOT NULL
);
-- Finished holds of slices: how long slices of a size are held (the wait estimates).
CREATE TABLE IF NOT EXISTS acct_holds (
    id INTEGER PRIMARY KEY,
    ended_at REAL NOT NULL,
    owner TEXT NOT NULL,
    memory INTEGER NOT NULL,
    seconds REAL NOT NULL
);
-- A waiting start's two wait estimates (the model's, the naive one), kept from the first time
-- it was estimated until it is placed (then judged: acct_judged) or withdrawn.
CREATE TABLE IF NOT EXISTS acct_estimates (
    kernel_id TEXT PRIMARY KEY,
    model REAL NOT NULL,
    naive REAL NOT NULL
);
-- Placed starts' kept estimates against when each was placed: the wait estimates answer the
-- model's or the naive one by which erred less on these.
CREATE TABLE IF NOT EXISTS acct_judged (
    id INTEGER PRIMARY KEY,
    model REAL NOT NULL,
    naive REAL NOT NULL,
    placed_at REAL NOT NULL
);
-- The kernel's own report of its cells, and what its idle timer will do.
CREATE TABLE IF NOT EXISTS acct_activity (
    kernel_id TEXT PRIMARY KEY,
    busy INTEGER NOT NULL,
    at REAL NOT NULL,
    idle_after REAL NOT NULL,
    idle_action TEXT NOT NULL
);
-- A user's JupyterHub groups, as the broker last saw them.
CREATE TABLE IF NOT EXISTS acct_groups (
    owner TEXT PRIMARY KEY,
    groups TEXT NOT NULL,
    at REAL NOT NULL
);
"""

# A request queued is not recorded (a start pays for two records: placed, and ended): the
# events of its placement or withdrawal carry when it was made. On ``slices``: what a file that
# keeps slices needs (the node ledger, and the Kubernetes broker's accounting file, whose
# ``slices`` mirror its kernel pods: :mod:`jupyter_gpushare.backends.kubernetes.broker.pod_accounting`).
SLICE_TRIGGERS = f"""
CREATE TRIGGER IF NOT EXISTS acct_slice_inserted AFTER INSERT ON slices
WHEN new.state = 'running' BEGIN
    {_EVENT} (COALESCE(new.placed_at, {NOW}), new.kernel_id, new.owner, 'placed', new.memory,
              new.memory_used, new.path, new.requested_at, new.kernel_name);
END;
CREATE TRIGGER IF NOT EXISTS acct_slice_placed AFTER UPDATE OF state ON slices
WHEN old.state = 'queued' AND new.state = 'running' BEGIN
    {_EVENT} (COALESCE(new.placed_at, {NOW}), new.kernel_id, new.owner, 'placed', new.memory,
              new.memory_used, new.path, new.requested_at, new.kernel_name);
END;
CREATE TRIGGER IF NOT EXISTS acct_slice_resized AFTER UPDATE OF memory ON slices
WHEN old.state = 'running' AND new.state = 'running' AND new.memory IS NOT old.memory BEGIN
    {_EVENT} ({NOW}, new.kernel_id, new.owner, 'resized', new.memory, NULL, '', NULL, '');
END;
CREATE TRIGGER IF NOT EXISTS acct_slice_used AFTER UPDATE OF memory_used ON slices
WHEN new.state = 'running' AND new.memory_used IS NOT old.memory_used BEGIN
    {_EVENT} (COALESCE(new.usage_at, {NOW}), new.kernel_id, new.owner, 'used', NULL,
              COALESCE(new.memory_used, 0), '', NULL, '');
END;
CREATE TRIGGER IF NOT EXISTS acct_slice_ended AFTER DELETE ON slices BEGIN
    {_EVENT} ({NOW}, old.kernel_id, old.owner,
              CASE old.state WHEN 'running' THEN 'ended' ELSE 'withdrawn' END, old.memory, NULL,
              old.path, old.requested_at, old.kernel_name);
END;
CREATE TRIGGER IF NOT EXISTS acct_estimate_judged AFTER UPDATE OF state ON slices
WHEN old.state = 'queued' AND new.state = 'running' BEGIN
    INSERT INTO acct_judged (model, naive, placed_at)
        SELECT model, naive, COALESCE(new.placed_at, {NOW}) FROM acct_estimates
        WHERE kernel_id = new.kernel_id;
    DELETE FROM acct_estimates WHERE kernel_id = new.kernel_id;
    DELETE FROM acct_judged WHERE id <= (SELECT MAX(id) FROM acct_judged) - {JUDGED};
END;
CREATE TRIGGER IF NOT EXISTS acct_estimate_dropped AFTER DELETE ON slices BEGIN
    DELETE FROM acct_estimates WHERE kernel_id = old.kernel_id;
END;
"""
# On the node ledger's ``released``: a suspended kernel's row.
RELEASED_TRIGGERS = f"""
CREATE TRIGGER IF NOT EXISTS acct_suspended AFTER INSERT ON released
WHEN new.suspended IS NOT NULL BEGIN
    {_EVENT} ({NOW}, new.kernel_id, new.owner, 'suspended', NULL, NULL, new.path, NULL, new.kernel_name);
END;
CREATE TRIGGER IF NOT EXISTS acct_unsuspended AFTER DELETE ON released
WHEN old.suspended IS NOT NULL BEGIN
    {_EVENT} ({NOW}, old.kernel_id, old.owner, 'unsuspended', NULL, NULL, '', NULL, '');
END;
"""
TRIGGERS = SLICE_TRIGGERS + RELEASED_TRIGGERS


# Columns a ledger file made by an earlier version lacks: (table, old name or None, name, type).
CHANGED_COLUMNS = (
    ("acct_events", "label", "path", "TEXT NOT NULL DEFAULT ''"),
    ("acct_events", None, "kernel_name", "TEXT NOT NULL DEFAULT ''"),
    ("acct_kernels", "label", "path", "TEXT NOT NULL DEFAULT ''"),
    ("acct_kernels", None, "kernel_name", "TEXT NOT NULL DEFAULT ''"),
    ("acct_kernels", None, "started_at", "REAL"),
)


def create(db: sqlite3.Connection, triggers: str = TRIGGERS) -> None:
    """Create the accounting's tables and ``triggers`` where missing, and bring those of an
    earlier version up to date (inside the caller's transaction, after the file's own tables: the
    triggers are on them; not ``executescript``, which would commit that transaction)."""
    for statement in _statements(TABLES):
        db.execute(statement)
    for table, old, name, declaration in CHANGED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if name in present:
            continue
        if old in present:
            db.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {name}")
        else:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
    create_triggers(db, triggers)


def create_triggers(db: sqlite3.Connection, script: str) -> None:
    """Create the triggers of ``script`` (``CREATE TRIGGER IF NOT EXISTS name … END;`` each)
    where missing, inside the caller's transaction. A trigger of an earlier version is
    replaced; an unchanged one is left alone (dropping it would change the schema, which every
    other connection to the file then reloads)."""
    for statement in _statements(script, separator="END;"):
        name = statement.split()[5]
        stored = db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (name,))
        row = stored.fetchone()
        if row is not None and row[0] != statement.replace(" IF NOT EXISTS", "", 1).removesuffix(";"):
            db.execute(f"DROP TRIGGER {name}")
        db.execute(statement)


def _statements(script: str, separator: str = ";") -> list[str]:
    script = "\n".join(line for line in script.splitlines() if not line.strip().startswith("--"))
    if separator == ";":
        return [part.strip() for part in script.split(";") if part.strip()]
    return [part.strip() + " END;" for part in script.split(separator) if part.strip()]


__all__ = [
    "CHANGED_COLUMNS",
    "FIGURE_COLUMNS",
    "NOW",
    "RELEASED_TRIGGERS",
    "SLICE_TRIGGERS",
    "TABLES",
    "TRIGGERS",
    "create",
    "create_triggers",
]
