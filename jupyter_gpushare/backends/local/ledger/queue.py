"""The queue and placement, inside the ledger's write transaction (sqlite, no file handling).

:class:`~jupyter_gpushare.backends.local.ledger.Ledger` opens the transaction; these functions read
the rows, ask the pure :func:`~jupyter_gpushare.core.placement.allocator.fit`, and write the
outcome. Who is first in line is the policy's (:mod:`jupyter_gpushare.core.placement.queue_order`):
the order of arrival (``fifo``, read straight from the rows), or fair share (``fair``: the users'
recent use, from the accounting).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jupyter_gpushare.backends.accounting import Keeping
from jupyter_gpushare.backends.accounting import store as accounts
from jupyter_gpushare.backends.local.ledger.schema import only_devices_of, read_devices, record_of, slice_rows
from jupyter_gpushare.core.placement.allocator import Held, NoFit, Policy, Request, Spot, fit
from jupyter_gpushare.core.placement.queue_order import QueueRule, Waiter, line_up, why_waiting
from jupyter_gpushare.core.records import (
    NewRequest,
    Outcome,
    Placed,
    ProcessIdentity,
    Refused,
    SliceRecord,
    Waiting,
)
from jupyter_gpushare.core.sizes import parse_size

LivenessCheck = Callable[[ProcessIdentity], bool]


def running(db: sqlite3.Connection) -> list[SliceRecord]:
    return [record_of(row) for row in slice_rows(db, "WHERE state = 'running'")]


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


@dataclass(frozen=True)
class _Arrival:
    """What a request finds in the ledger as it comes in (one statement, under the write lock)."""

    existing: bool  # the kernel has a row already (a restart)
    seq: int  # its place in the queue, if it gets a new row
    anyone_queued: bool
    request: NewRequest  # with what the kernel left when it last gave a slice back
    left_something: bool  # it did give one back: that row goes when its new row comes
    held_before: tuple[int, str | None]  # bytes its processes still hold there, and the source


def _arrive(db: sqlite3.Connection, request: NewRequest) -> _Arrival:
    # Whether the kernel has a row already, the next place in the queue, whether anyone waits,
    # and what the kernel left when it last gave a slice back (name, path, memory its processes
    # still hold): all a request needs to know, in one statement.
    existing, seq, anyone_queued, *left = db.execute(
        """SELECT EXISTS (SELECT 1 FROM slices WHERE kernel_id = :kernel),
                  (SELECT COALESCE(MAX(seq), 0) + 1 FROM slices),
                  EXISTS (SELECT 1 FROM slices WHERE state = 'queued'),
                  released.kernel_id, released.kernel_name, released.path, released.device_uuid,
                  released.held, released.held_source
           FROM (SELECT 1) LEFT JOIN released ON released.kernel_id = :kernel""",
        {"kernel": request.kernel_id},
    ).fetchone()
    left_id, left_name, left_path, left_device, left_held, left_source = left
    held_before: tuple[int, str | None] = (0, None)
    if not existing and left_id is not None:
        # A kernel taking a slice again keeps the name and path it had (the panel's row).
        request = dataclasses.replace(
            request, kernel_name=request.kernel_name or left_name, path=request.path or left_path
        )
        if left_held > 0 and left_device is not None:
            # Its processes still hold memory there: its new slice goes there and counts it.
            held_before = (left_held, left_source)
            if request.only_devices is None:
                request = dataclasses.replace(request, only_devices=(left_device,))
    return _Arrival(bool(existing), int(seq), bool(anyone_queued), request, left_id is not None, held_before)


def enqueue(db: sqlite3.Connection, request: NewRequest, read_back: bool = True) -> SliceRecord | None:
    """Add a queued request; a kernel that already has a row (a restart) keeps it."""
    _queue(db, _arrive(db, request))
    if not read_back:
        return None
    return record_of(slice_rows(db, "WHERE kernel_id = ?", (request.kernel_id,))[0])


def request_placed(
    db: sqlite3.Connection, request: NewRequest, policy: Policy, alive: LivenessCheck
) -> Outcome:
    """Queue a request and try to place it.

    The common start — a new kernel, nobody waiting, room on a card — is written straight as a
    running slice: one insert, where queueing first would insert, read the row back and update
    it (all under the write lock, which every start on the node waits for).
    """
    arrival = _arrive(db, request)
    if not arrival.existing and not arrival.anyone_queued:
        request = arrival.request
        devices = read_devices(db)
        if request.only_devices is not None:
            devices = [device for device in devices if device.uuid in request.only_devices]
        wanted = Request(request.kernel_id, request.owner, parse_size(request.size), request.placement)
        outcome = fit(wanted, devices, held(db), policy)
        if isinstance(outcome, Spot):
            return Placed(_insert(db, arrival, outcome))
    _queue(db, arrival)
    return place(db, request.kernel_id, policy, alive)


def _queue(db: sqlite3.Connection, arrival: _Arrival) -> None:
    request = arrival.request
    if arrival.existing:
        db.execute(
            "UPDATE slices SET holder_pid = ?, holder_start = ?,"
            " token_hash = COALESCE(?, token_hash) WHERE kernel_id = ?",
            (request.holder.pid, request.holder.start, request.token_hash, request.kernel_id),
        )
    else:
        _insert(db, arrival, None)


def _insert(db: sqlite3.Connection, arrival: _Arrival, spot: Spot | None) -> SliceRecord:
    """A new row: queued, or (``spot``) running there; the record as written."""
    request, (held_bytes, held_source) = arrival.request, arrival.held_before
    if arrival.left_something:
        db.execute("DELETE FROM released WHERE kernel_id = ?", (request.kernel_id,))
    now = time.time()
    record = SliceRecord(
        kernel_id=request.kernel_id,
        seq=arrival.seq,
        state="queued" if spot is None else "running",
        owner=request.owner,
        server_id=request.server_id,
        kernel_name=request.kernel_name,
        path=request.path,
        mode=request.mode,
        placement=request.placement,
        size=request.size,
        cores=request.cores,
        device_uuid=None if spot is None else spot.device_uuid,
        unit_uuid=None if spot is None else spot.unit_uuid,
        memory=0 if spot is None else spot.memory,
        whole_card=spot is not None and spot.whole_card,
        holder=request.holder,
        kernel=None,
        requested_at=now,
        placed_at=None if spot is None else now,
        token_hash=request.token_hash,
        memory_used=held_bytes or None,
        usage_source=held_source,
    )
    db.execute(
        """INSERT INTO slices (kernel_id, seq, state, owner, server_id, kernel_name, path, mode,
           kind, size, cores, device_uuid, unit_uuid, memory, whole_card, holder_pid,
           holder_start, requested_at, placed_at, token_hash, only_devices, memory_used,
           usage_source)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (
            record.kernel_id,
            record.seq,
            record.state,
            record.owner,
            record.server_id,
            record.kernel_name,
            record.path,
            record.mode,
            record.placement,
            record.size,
            record.cores,
            record.device_uuid,
            record.unit_uuid,
            record.memory,
            int(record.whole_card),
            record.holder.pid,
            record.holder.start,
            record.requested_at,
            record.placed_at,
            record.token_hash,
            None if request.only_devices is None else json.dumps(list(request.only_devices)),
            record.memory_used,
            record.usage_source,
        ),
    )
    return record


def head_of_queue(db: sqlite3.Connection, before_seq: int) -> tuple[int, SliceRecord | None]:
    """How many queued requests are ahead of ``before_seq``, and the first of them."""
    count = db.execute(
        "SELECT COUNT(*) FROM slices WHERE state = 'queued' AND seq < ?", (before_seq,)
    ).fetchone()[0]
    if not count:
        return 0, None
    rows = slice_rows(db, "WHERE state = 'queued' AND seq < ? ORDER BY seq LIMIT 1", (before_seq,))
    return int(count), record_of(rows[0])


_QUEUED_AHEAD = (
    "(SELECT COUNT(*) FROM slices AS ahead WHERE ahead.state = 'queued' AND ahead.seq < slices.seq)"
)


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
    # The row, and how many queued requests are ahead of it, in one statement.
    rows = slice_rows(db, "WHERE kernel_id = ?", (kernel_id,), also=_QUEUED_AHEAD)
    if not rows:
        raise LookupError(f"no GPU request for kernel {kernel_id} in the ledger")
    record = record_of(rows[0][:-1])
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
        ahead, head = head_of_queue(db, record.seq) if rows[0][-1] else (0, None)
        # Only the head of the queue is checked for life: dead requests behind it are dropped
        # when they reach the head, so each poll costs one process check, not one per waiter.
        while head is not None and not alive(head.process):
            db.execute("DELETE FROM slices WHERE kernel_id = ?", (head.kernel_id,))
            ahead, head = head_of_queue(db, record.seq)
        if ahead:
            return waiting(ahead)
    request = Request(kernel_id, record.owner, parse_size(record.size), record.placement)
    devices = read_devices(db)
    allowed = only_devices_of(rows[0])
    if allowed is not None:
        devices = [device for device in devices if device.uuid in allowed]
    outcome = fit(request, devices, held(db), policy)
    if isinstance(outcome, NoFit) and outcome.retry and release_dead(db, alive, running(db)):
        outcome = fit(request, devices, held(db), policy)
    if isinstance(outcome, NoFit):
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
    queued = [record_of(row) for row in slice_rows(db, "WHERE state = 'queued'")]
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
