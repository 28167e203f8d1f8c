"""Reading and writing the accounting's tables (sqlite; the arithmetic is
:mod:`jupyter_gpushare.core.accounting.tally`'s).

Every function works inside a transaction its caller holds on the node ledger's file: the fold
and the roll-up in a write transaction, the reads in a read snapshot. The events the triggers
recorded (:mod:`.schema`) are folded into figures by whoever comes first — the usage monitor
after a sampling round, a report, the queue under fair share — so they never pile up.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from jupyter_gpushare.backends.accounting.schema import FIGURE_COLUMNS
from jupyter_gpushare.core.accounting.tally import (
    DETAIL_SECONDS,
    ROLLED_SECONDS,
    TEST_KERNEL_NAME,
    Event,
    Figures,
    KernelAccount,
    add_spans,
    bucket_of,
    fold,
    open_figures,
    recent_use,
    span_weight,
)
from jupyter_gpushare.core.accounting.usage_report import ROLLED_TESTS, Bucket, KernelInfo
from jupyter_gpushare.core.placement.wait_estimate import JUDGED, History, Judged

HOLDS_KEPT = 2000  # finished holds kept for the wait estimates
ROLL_UP_EVERY = 600.0  # seconds between roll-ups of buckets older than the retention

_ACCOUNT_COLUMNS = (
    "kernel_id",
    "owner",
    "path",
    "phase",
    "since",
    "memory",
    "used",
    "busy",
    "queued_at",
    "placed_at",
    "resuming",
    "released",
    "kernel_name",
    "started_at",
)
_ADD_FIGURES = ", ".join(f"{name} = {name} + excluded.{name}" for name in FIGURE_COLUMNS)
_FIGURE_LIST = ", ".join(FIGURE_COLUMNS)
_FIGURE_MARKS = ", ".join("?" for _ in FIGURE_COLUMNS)


@dataclass(frozen=True)
class Keeping:
    """How long what is kept (``GPUShare.accounting_retention``, ``accounting_history``) and the
    half life of recent use (``GPUShare.fair_share_half_life``), in seconds."""

    retention: float = 7 * 86400.0
    history: float = 400 * 86400.0  # 0: forever
    half_life: float = 86400.0


@dataclass(frozen=True)
class Activity:
    """A kernel's own report of its cells."""

    busy: bool
    at: float
    idle_after: float
    idle_action: str


# ---- the fold ---------------------------------------------------------------------------------------


def pending(db: sqlite3.Connection) -> bool:
    """Whether events wait to be folded (one indexed read)."""
    return db.execute("SELECT 1 FROM acct_events LIMIT 1").fetchone() is not None


def fold_events(db: sqlite3.Connection, now: float, keeping: Keeping, roll_up_too: bool = True) -> int:
    """Fold every recorded event into the figures (write transaction); returns how many. Also
    rolls up old buckets when that is due (``roll_up_too``)."""
    rows = db.execute("SELECT * FROM acct_events ORDER BY id").fetchall()
    if rows:
        events = [
            Event(
                row["at"],
                row["kernel_id"],
                row["owner"],
                row["what"],
                row["memory"],
                row["used"],
                row["path"],
                row["requested_at"],
                row["kernel_name"],
            )
            for row in rows
        ]
        accounts = _accounts(db, {event.kernel_id for event in events})
        folded = fold(accounts, events)
        changed = {event.kernel_id for event in events}
        db.executemany(
            f"INSERT OR REPLACE INTO acct_kernels ({', '.join(_ACCOUNT_COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in _ACCOUNT_COLUMNS)})",
            [
                _account_values(folded.accounts[kernel_id])
                for kernel_id in changed
                if kernel_id in folded.accounts
            ],
        )
        _add_buckets(db, folded.buckets, DETAIL_SECONDS)
        tests = {kernel_id for kernel_id, account in folded.accounts.items() if account.test}
        _add_totals(db, {key: figures for key, figures in folded.buckets.items() if key[1] not in tests})
        _add_spans(db, folded.spans, keeping.half_life, now)
        db.executemany(
            "INSERT INTO acct_holds (ended_at, owner, memory, seconds) VALUES (?, ?, ?, ?)",
            [(hold.ended_at, hold.owner, hold.memory, hold.seconds) for hold in folded.holds],
        )
        db.execute("DELETE FROM acct_events WHERE id <= ?", (rows[-1]["id"],))
    if roll_up_too and _roll_up_due(db, now):
        roll_up(db, now, keeping)
    return len(rows)


def _accounts(db: sqlite3.Connection, kernel_ids: Iterable[str] | None = None) -> dict[str, KernelAccount]:
    if kernel_ids is None:
        rows = db.execute("SELECT * FROM acct_kernels WHERE phase != 'gone'").fetchall()
    else:
        ids = list(kernel_ids)
        rows = []
        for start in range(0, len(ids), 500):  # sqlite's limit of parameters, with room
            chunk = ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            rows += db.execute(f"SELECT * FROM acct_kernels WHERE kernel_id IN ({marks})", chunk).fetchall()
    return {row["kernel_id"]: _account_of(row) for row in rows}


def _account_of(row: sqlite3.Row) -> KernelAccount:
    return KernelAccount(
        kernel_id=row["kernel_id"],
        owner=row["owner"],
        path=row["path"],
        phase=row["phase"],
        since=row["since"],
        memory=row["memory"],
        used=row["used"],
        busy=bool(row["busy"]),
        queued_at=row["queued_at"],
        placed_at=row["placed_at"],
        resuming=bool(row["resuming"]),
        released=bool(row["released"]),
        kernel_name=row["kernel_name"],
        started_at=row["started_at"],
    )


def _account_values(account: KernelAccount) -> tuple[object, ...]:
    return (
        account.kernel_id,
        account.owner,
        account.path,
        account.phase,
        account.since,
        account.memory,
        account.used,
        int(account.busy),
        account.queued_at,
        account.placed_at,
        int(account.resuming),
        int(account.released),
        account.kernel_name,
        account.started_at,
    )


def _add_buckets(
    db: sqlite3.Connection, buckets: Mapping[tuple[float, str, str], Figures], width: float
) -> None:
    db.executemany(
        f"INSERT INTO acct_usage (start, width, kernel_id, owner, {_FIGURE_LIST}) "
        f"VALUES (?, ?, ?, ?, {_FIGURE_MARKS}) "
        f"ON CONFLICT (start, kernel_id, owner) DO UPDATE SET {_ADD_FIGURES}",
        [
            (start, width, kernel_id, owner, *figures.values())
            for (start, kernel_id, owner), figures in buckets.items()
        ],
    )


def _add_totals(db: sqlite3.Connection, buckets: Mapping[tuple[float, str, str], Figures]) -> None:
    by_owner: dict[str, Figures] = defaultdict(Figures)
    for (_, _, owner), figures in buckets.items():
        by_owner[owner].add(figures)
    db.executemany(
        f"INSERT INTO acct_totals (owner, {_FIGURE_LIST}) VALUES (?, {_FIGURE_MARKS}) "
        f"ON CONFLICT (owner) DO UPDATE SET {_ADD_FIGURES}",
        [(owner, *figures.values()) for owner, figures in by_owner.items()],
    )


def _add_spans(
    db: sqlite3.Connection, spans: Sequence[tuple[str, float, float, int]], half_life: float, now: float
) -> None:
    by_owner: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for owner, start, end, memory in spans:
        by_owner[owner].append((start, end, memory))
    for owner, owned in by_owner.items():
        row = db.execute("SELECT value, at, half_life FROM acct_decay WHERE owner = ?", (owner,)).fetchone()
        if row is None or row["half_life"] != half_life:
            # New, or the half life changed: start from the buckets already kept (before these).
            value, at = _decay_from_buckets(db, owner, now, half_life), now
        else:
            value, at = row["value"], row["at"]
        value, at = add_spans(value, at, owned, half_life)
        db.execute(
            "INSERT OR REPLACE INTO acct_decay (owner, value, at, half_life) VALUES (?, ?, ?, ?)",
            (owner, value, at, half_life),
        )


def _decay_from_buckets(db: sqlite3.Connection, owner: str, now: float, half_life: float) -> float:
    rows = db.execute("SELECT start, width, reserved FROM acct_usage WHERE owner = ?", (owner,)).fetchall()
    weights = (
        row["reserved"]
        / row["width"]
        * span_weight(row["start"], row["start"] + row["width"], now, half_life)
        for row in rows
    )
    return float(sum(weights))


def _roll_up_due(db: sqlite3.Connection, now: float) -> bool:
    row = db.execute("SELECT value FROM meta WHERE key = 'acct_rolled_up_at'").fetchone()
    return row is None or now - float(row[0]) >= ROLL_UP_EVERY


def roll_up(db: sqlite3.Connection, now: float, keeping: Keeping) -> None:
    """Sum the buckets older than the retention by user and hour, drop what is older than the
    history, and forget the accounts and reports of kernels gone that long."""
    cutoff = bucket_of(now - keeping.retention, ROLLED_SECONDS)
    sums = ", ".join(f"SUM({name})" for name in FIGURE_COLUMNS)
    # The doctor's test kernels are rolled up apart from their owner's kernels (ROLLED_TESTS),
    # so that they stay out of users' figures once their own accounts are forgotten.
    db.execute(
        f"INSERT INTO acct_usage (start, width, kernel_id, owner, {_FIGURE_LIST}) "
        f"SELECT CAST(start / {ROLLED_SECONDS} AS INTEGER) * {ROLLED_SECONDS}, {ROLLED_SECONDS}, "
        "CASE WHEN kernel_id IN (SELECT kernel_id FROM acct_kernels WHERE kernel_name = ?) "
        f"THEN ? ELSE '' END, owner, {sums} "
        "FROM acct_usage WHERE width < ? AND start < ? GROUP BY 1, 3, owner "
        f"ON CONFLICT (start, kernel_id, owner) DO UPDATE SET {_ADD_FIGURES}",
        (TEST_KERNEL_NAME, ROLLED_TESTS, ROLLED_SECONDS, cutoff),
    )
    db.execute("DELETE FROM acct_usage WHERE width < ? AND start < ?", (ROLLED_SECONDS, cutoff))
    if keeping.history > 0:
        db.execute("DELETE FROM acct_usage WHERE start + width <= ?", (now - keeping.history,))
    db.execute("DELETE FROM acct_kernels WHERE phase = 'gone' AND since < ?", (cutoff,))
    db.execute(
        "DELETE FROM acct_activity WHERE kernel_id NOT IN (SELECT kernel_id FROM slices)"
        " AND kernel_id NOT IN (SELECT kernel_id FROM released)"
    )
    db.execute("DELETE FROM acct_holds WHERE id <= (SELECT MAX(id) FROM acct_holds) - ?", (HOLDS_KEPT,))
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('acct_rolled_up_at', ?)", (str(now),))


# ---- what the kernel reports, and who is in which group --------------------------------------------


def note_activity(
    db: sqlite3.Connection, kernel_id: str, busy: bool, at: float, idle_after: float, idle_action: str
) -> bool:
    """A kernel's cell started (``busy``) or ended, at ``at``; False for a kernel the ledger does
    not know (it holds no slice and is not suspended: nothing to account)."""
    row = db.execute(
        "SELECT owner FROM slices WHERE kernel_id = ?"
        " UNION ALL SELECT owner FROM released WHERE kernel_id = ?",
        (kernel_id, kernel_id),
    ).fetchone()
    if row is None:
        return False
    db.execute(
        "INSERT OR REPLACE INTO acct_activity (kernel_id, busy, at, idle_after, idle_action)"
        " VALUES (?, ?, ?, ?, ?)",
        (kernel_id, int(busy), at, idle_after, idle_action),
    )
    db.execute(
        "INSERT INTO acct_events (at, kernel_id, owner, what) VALUES (?, ?, ?, ?)",
        (at, kernel_id, row["owner"], "busy" if busy else "idle"),
    )
    return True


def note_groups(db: sqlite3.Connection, owner: str, groups: Sequence[str], now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO acct_groups (owner, groups, at) VALUES (?, ?, ?)",
        (owner, json.dumps(sorted(set(groups))), now),
    )


# ---- reads --------------------------------------------------------------------------------------------


def activity(db: sqlite3.Connection) -> dict[str, Activity]:
    return {
        row["kernel_id"]: Activity(bool(row["busy"]), row["at"], row["idle_after"], row["idle_action"])
        for row in db.execute("SELECT * FROM acct_activity")
    }


def groups(db: sqlite3.Connection) -> dict[str, list[str]]:
    return {row["owner"]: list(json.loads(row["groups"])) for row in db.execute("SELECT * FROM acct_groups")}


def history(db: sqlite3.Connection) -> History:
    rows = db.execute(
        "SELECT memory, seconds, ended_at FROM acct_holds ORDER BY id DESC LIMIT ?", (HOLDS_KEPT,)
    ).fetchall()
    judged = db.execute(
        "SELECT model, naive, placed_at FROM acct_judged ORDER BY id DESC LIMIT ?", (JUDGED,)
    ).fetchall()
    return History(
        tuple((row["memory"], row["seconds"]) for row in rows),
        tuple(row["ended_at"] for row in rows),
        tuple(Judged(row["model"], row["naive"], row["placed_at"]) for row in reversed(judged)),
    )


def kept_estimates(db: sqlite3.Connection) -> set[str]:
    """The waiting starts whose estimates are kept."""
    return {row[0] for row in db.execute("SELECT kernel_id FROM acct_estimates")}


def keep_estimates(db: sqlite3.Connection, kept: Mapping[str, tuple[float, float]]) -> None:
    """Keep the (model, naive) estimates of waiting starts (write transaction): the first kept
    stays, and a start no longer waiting has nothing to keep."""
    db.executemany(
        "INSERT OR IGNORE INTO acct_estimates (kernel_id, model, naive)"
        " SELECT kernel_id, ?, ? FROM slices WHERE kernel_id = ? AND state = 'queued'",
        [(model, naive, kernel_id) for kernel_id, (model, naive) in kept.items()],
    )


def recent(db: sqlite3.Connection, now: float, half_life: float) -> dict[str, float]:
    """Each user's decayed reserved byte-seconds at ``now`` (what fair share orders by)."""
    stored = {
        row["owner"]: (row["value"], row["at"])
        for row in db.execute("SELECT owner, value, at FROM acct_decay")
    }
    return recent_use(stored, _accounts(db).values(), now, half_life)


def buckets(
    db: sqlite3.Connection, since: float, now: float, owners: Iterable[str] | None = None
) -> tuple[list[Bucket], dict[str, KernelInfo]]:
    """Stored and open buckets from ``since`` on (of ``owners``, or everyone's), and what
    identifies each kernel (its notebook, kernelspec and start)."""
    wanted = None if owners is None else set(owners)
    found = [
        Bucket(
            row["start"],
            row["width"],
            row["kernel_id"],
            row["owner"],
            Figures.of(row[name] for name in FIGURE_COLUMNS),
        )
        for row in db.execute("SELECT * FROM acct_usage WHERE start + width > ?", (since,))
        if wanted is None or row["owner"] in wanted
    ]
    accounts = _accounts(db)
    for (start, kernel_id, owner), figures in open_figures(accounts.values(), now).items():
        if wanted is None or owner in wanted:
            found.append(Bucket(start, DETAIL_SECONDS, kernel_id, owner, figures))
    kernels = {
        row["kernel_id"]: KernelInfo(row["path"], row["kernel_name"], row["started_at"])
        for row in db.execute("SELECT kernel_id, path, kernel_name, started_at FROM acct_kernels")
    }
    return found, kernels


def totals(db: sqlite3.Connection, now: float, owners: Iterable[str] | None = None) -> dict[str, Figures]:
    """Every user's figures since accounting began (and what open accounts accrued up to now),
    the doctor's test kernels left out."""
    wanted = None if owners is None else set(owners)
    found = {
        row["owner"]: Figures.of(row[name] for name in FIGURE_COLUMNS)
        for row in db.execute("SELECT * FROM acct_totals")
        if wanted is None or row["owner"] in wanted
    }
    counted = (account for account in _accounts(db).values() if not account.test)
    for (_, _, owner), figures in open_figures(counted, now).items():
        if wanted is None or owner in wanted:
            found.setdefault(owner, Figures()).add(figures)
    return found


__all__ = [
    "Activity",
    "Keeping",
    "activity",
    "buckets",
    "fold_events",
    "groups",
    "history",
    "note_activity",
    "note_groups",
    "pending",
    "recent",
    "roll_up",
    "totals",
]
