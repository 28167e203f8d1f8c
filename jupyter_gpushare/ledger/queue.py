"""The queue and placement, inside the ledger's write transaction (sqlite, no file handling).

:class:`~jupyter_gpushare.ledger.Ledger` opens the transaction; these functions read the rows,
ask the pure :func:`~jupyter_gpushare.allocator.fit`, and write the outcome. Who is first in line
is the policy's (:mod:`jupyter_gpushare.queue_order`): the order of arrival (``fifo``, read
straight from the rows), or fair share (``fair``: the users' recent use, from the accounting).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..accounting import Keeping
from ..accounting import store as accounts
from ..allocator import Held, Policy, Refusal, Request, fit
from ..queue_order import QueueRule, Waiter, line_up, why_waiting
from ..records import NewRequest, Outcome, Placed, ProcessIdentity, Refused, SliceRecord, Waiting
from ..sizes import parse_size
from .schema import read_devices, record_of

LivenessCheck = Callable[[ProcessIdentity], bool]


def running(db: sqlite3.Connection) -> list[SliceRecord]:
    return [record_of(row) for row in db.execute("SELECT * FROM slices WHERE state = 'running'")]


def held(db: sqlite3.Connection) -> list[Held]:
    """What placement counts as taken: each running slice, or what its processes were last
    measured to hold when that is more; and what released kernels' processes still hold."""
    # Only the columns placement needs: this runs in every placement, under the write lock.
    rows = db.execute(
        "SELECT kernel_id, owner, device_uuid, unit_uuid, MAX(memory, COALESCE(memory_used, 0)),"
        " whole_card FROM slices WHERE state = 'running'"
        " UNION ALL SELECT kernel_id, owner, device_uuid, COALESCE(unit_uuid, device_uuid), held, 0"
        " FROM released WHERE held > 0 AND device_uuid IS NOT NULL"
    ).fetchall()
    return [Held(row[0], row[1], row[2], row[3], row[4], bool(row[5])) for row in rows]


def enqueue(db: sqlite3.Connection, request: NewRequest, read_back: bool = True) -> SliceRecord | None:
    existing = db.execute("SELECT kernel_id FROM slices WHERE kernel_id = ?", (request.kernel_id,)).fetchone()
    if existing:
        db.execute(
            "UPDATE slices SET holder_pid = ?, holder_start = ?,"
            " token_hash = COALESCE(?, token_hash) WHERE kernel_id = ?",
            (request.holder.pid, request.holder.start, request.token_hash, request.kernel_id),
        )
    else:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM slices").fetchone()[0]
        # A kernel taking a slice again keeps the name and path it had (the panel's row).
        left = db.execute(
            "SELECT kernel_name, path, device_uuid, held, held_source FROM released WHERE kernel_id = ?",
            (request.kernel_id,),
        ).fetchone()
        held_before: tuple[int, str | None] = (0, None)
        if left is not None:
            request = dataclasses.replace(
                request,
                kernel_name=request.kernel_name or left["kernel_name"],
                path=request.path or left["path"],
            )
            if left["held"] > 0 and left["device_uuid"] is not None:
                # Its processes still hold memory there: its new slice goes there and counts it.
                held_before = (left["held"], left["held_source"])
                if request.only_devices is None:
                    request = dataclasses.replace(request, only_devices=(left["device_uuid"],))
            db.execute("DELETE FROM released WHERE kernel_id = ?", (request.kernel_id,))
        db.execute(
            """INSERT INTO slices (kernel_id, seq, state, owner, server_id, kernel_name,
               path, mode, kind, size, cores, holder_pid, holder_start, requested_at,
               token_hash, only_devices, memory_used, usage_source)
               VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
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
                None if request.only_devices is None else json.dumps(list(request.only_devices)),
                held_before[0] or None,
                held_before[1],
            ),
        )
    if not read_back:
        return None
    row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (request.kernel_id,)).fetchone()
    return record_of(row)


def head_of_queue(db: sqlite3.Connection, before_seq: int) -> tuple[int, SliceRecord | None]:
    """How many queued requests are ahead of ``before_seq``, and the first of them."""
    count = db.execute(
        "SELECT COUNT(*) FROM slices WHERE state = 'queued' AND seq < ?", (before_seq,)
    ).fetchone()[0]
    if not count:
        return 0, None
    row = db.execute(
        "SELECT * FROM slices WHERE state = 'queued' AND seq < ? ORDER BY seq LIMIT 1", (before_seq,)
    ).fetchone()
    return int(count), record_of(row)


def waiting(ahead: int) -> Waiting:
    plural = "s" if ahead > 1 else ""
    return Waiting(ahead + 1, f"behind {ahead} earlier GPU request{plural}")


def waiting_behind(
    db: sqlite3.Connection, kernel_id: str, alive: LivenessCheck, rule: QueueRule
) -> Waiting | None:
    """Waiting, read without a lock, when a live request is ahead; None when a write must decide."""
    row = db.execute("SELECT state, seq FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
    if row is None or row["state"] != "queued":
        return None
    if rule.fair:
        line = fair_line(db, kernel_id, rule)
        if not line.ahead or not alive(line.ahead[0].process):
            return None
        return Waiting(len(line.ahead) + 1, line.why)
    ahead, head = head_of_queue(db, row["seq"])
    if head is None or not alive(head.process):
        return None
    return waiting(ahead)


def place(db: sqlite3.Connection, kernel_id: str, policy: Policy, alive: LivenessCheck) -> Outcome:
    row = db.execute("SELECT * FROM slices WHERE kernel_id = ?", (kernel_id,)).fetchone()
    if row is None:
        raise LookupError(f"no GPU request for kernel {kernel_id} in the ledger")
    record = record_of(row)
    if record.state == "running":
        return Placed(record)
    if policy.queue.fair:
        line = fair_line(db, kernel_id, policy.queue, fold=True)
        while line.ahead and not alive(line.ahead[0].process):
            db.execute("DELETE FROM slices WHERE kernel_id = ?", (line.ahead[0].kernel_id,))
            line = fair_line(db, kernel_id, policy.queue)
        if line.ahead:
            return Waiting(len(line.ahead) + 1, line.why)
    else:
        ahead, head = head_of_queue(db, record.seq)
        # Only the head of the queue is checked for life: dead requests behind it are dropped
        # when they reach the head, so each poll costs one process check, not one per waiter.
        while head is not None and not alive(head.process):
            db.execute("DELETE FROM slices WHERE kernel_id = ?", (head.kernel_id,))
            ahead, head = head_of_queue(db, record.seq)
        if ahead:
            return waiting(ahead)
    request = Request(kernel_id, record.owner, parse_size(record.size), record.kind)
    devices = read_devices(db)
    if row["only_devices"] is not None:
        allowed = set(json.loads(row["only_devices"]))
        devices = [device for device in devices if device.uuid in allowed]
    outcome = fit(request, devices, held(db), policy)
    if isinstance(outcome, Refusal) and outcome.retry and release_dead(db, alive, running(db)):
        outcome = fit(request, devices, held(db), policy)
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


@dataclass(frozen=True)
class Line:
    """Where a queued request stands under fair share: those ahead of it, and why."""

    ahead: list[SliceRecord]
    why: str


def fair_line(db: sqlite3.Connection, kernel_id: str, rule: QueueRule, fold: bool = False) -> Line:
    """The queued requests served before ``kernel_id``'s under fair share. ``fold``: fold the
    accounting's recorded events first (inside a write transaction), so the users' recent use
    counts every slice placed until now."""
    queued = [record_of(row) for row in db.execute("SELECT * FROM slices WHERE state = 'queued'")]
    if len(queued) < 2:
        return Line([], "")  # alone in the queue: first, whatever anyone's use
    now = time.time()
    if fold and accounts.pending(db):
        accounts.fold_events(db, now, Keeping(half_life=rule.half_life), roll_up_too=False)
    usage = accounts.recent(db, now, rule.half_life)
    waiters = {record.kernel_id: _waiter(record) for record in queued}
    me = waiters[kernel_id]
    order = line_up(waiters.values(), usage, now, rule)
    ahead = order[: order.index(me)]
    by_id = {record.kernel_id: record for record in queued}
    return Line([by_id[waiter.kernel_id] for waiter in ahead], why_waiting(me, ahead, usage, now, rule))


def _waiter(record: SliceRecord) -> Waiter:
    return Waiter(record.kernel_id, record.owner, record.seq, record.requested_at)


def release_dead(db: sqlite3.Connection, alive: LivenessCheck, records: Sequence[SliceRecord]) -> bool:
    """Delete the slices of dead processes, and what dead released kernels still held."""
    dead = [record.kernel_id for record in records if not alive(record.process)]
    db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(kernel_id,) for kernel_id in dead])
    holding = db.execute("SELECT kernel_id, pid, start FROM released WHERE held > 0").fetchall()
    gone = [(row[0],) for row in holding if not alive(ProcessIdentity(row[1], row[2]))]
    db.executemany("DELETE FROM released WHERE kernel_id = ?", gone)
    return bool(dead or gone)
