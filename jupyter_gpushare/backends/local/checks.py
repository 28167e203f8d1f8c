"""The local backend's answers before anything is reserved: a start's request checked against the
node (``check``), and what a start would do now (``preview``, for ``GET fit`` and the start
picker), and where a start may be placed (``where_allowed``). They read the same ledger and make
the same placement a start makes; none writes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.core.errors import DoesNotFitError, ModeUnavailableError, NoGPUError
from jupyter_gpushare.core.modes import NodeFacts
from jupyter_gpushare.core.placement.allocator import NoFit, Policy, Request, fit
from jupyter_gpushare.core.placement.preview import Preview, never, preview_start
from jupyter_gpushare.core.placement.queue_order import Waiter, ahead_of, why_waiting
from jupyter_gpushare.core.placement.wait_estimate import expected_start
from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import parse_size
from jupyter_gpushare.core.slice_request import SliceRequest

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.accounts import LedgerAccounts


@dataclass(frozen=True)
class Asked:
    """Who asks and what the node offers, as the local backend holds them."""

    kernel_id: str
    owner: str
    ledger: Ledger
    inventory_problem: str | None
    facts: NodeFacts
    policy: Policy
    when_full: str
    accounts: LedgerAccounts


def where_allowed(
    ledger: Ledger, request: SliceRequest, only_devices: Sequence[str] | None
) -> Sequence[str] | None:
    """Where a request may be placed: ``only_devices``; for an exclusive request of a size, the
    cards at least that large (kept with the request, so a card too small is never taken)."""
    least = request.card_at_least
    if only_devices is not None or least is None:
        return only_devices
    return [device.uuid for device in ledger.devices() if device.memory_total >= least]


def check(asked: Asked, request: SliceRequest) -> SliceRequest:
    """``request`` when this node can honour it now or later; raises with the reason otherwise."""
    devices = asked.ledger.devices()
    if not devices:
        raise NoGPUError(asked.inventory_problem or "no GPU found")
    missing = request.mode.unavailable_reason(asked.facts)
    if missing:
        raise ModeUnavailableError(missing)
    # Refuse at once what waiting cannot change (too large, above a quota), before anything
    # waits or starts; what could fit once others end is the queue's business.
    wanted = Request(asked.kernel_id, asked.owner, request.size, request.mode.placement, request.card)
    never_fits = fit(wanted, devices, asked.ledger.held(), asked.policy)
    if isinstance(never_fits, NoFit) and not never_fits.retry:
        raise DoesNotFitError(never_fits.reason)
    return request


def preview(asked: Asked, request: SliceRequest) -> Preview:
    """What starting a kernel with ``request`` would do now; nothing is reserved."""
    devices = asked.ledger.devices()
    if not devices:
        return never(asked.inventory_problem or "no GPU found", "no GPU in the pool")
    missing = request.mode.unavailable_reason(asked.facts)
    if missing:
        return never(missing)
    records = asked.ledger.records()
    queued = [record for record in records if record.state == "queued" and is_alive(record.process)]
    wanted = Request("", asked.owner, request.size, request.mode.placement, request.card)
    held = asked.ledger.held()
    now = time.time()
    rule = asked.policy.queue
    why = None
    if rule.fair and queued:
        # Where a start made now would stand: behind the old requests and those of users with
        # less recent use than this user's.
        usage = asked.accounts.recent(now, rule)
        me = Waiter("", asked.owner, max(record.seq for record in records) + 1, now)
        waiters = {record.kernel_id: record for record in queued}
        before = ahead_of(me, (_waiter(record) for record in queued), usage, now, rule)
        queued = [waiters[waiter.kernel_id] for waiter in before]
        why = why_waiting(me, before, usage, now, rule)

    def estimate() -> tuple[float | None, float]:
        since = {record.kernel_id: record.placed_at for record in records if record.placed_at is not None}
        ahead = [Request(r.kernel_id, r.owner, parse_size(r.size), r.placement) for r in queued]
        history = asked.accounts.history()
        return expected_start(now, wanted, ahead, devices, held, since, history, asked.policy), now

    return preview_start(
        wanted, devices, held, len(queued), asked.policy, asked.when_full, why_ahead=why, estimate=estimate
    )


def _waiter(record: SliceRecord) -> Waiter:
    return Waiter(record.kernel_id, record.owner, record.seq, record.requested_at)
