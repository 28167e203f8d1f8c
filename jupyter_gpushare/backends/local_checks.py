"""The local backend's answers before anything is reserved: a start's request checked against the
node (``check``), and what a start would do now (``preview``, for ``GET fit`` and the start
picker), and where a start may be placed (``where_allowed``). They read the same ledger and make
the same placement a start makes; none writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..allocator import Policy, Refusal, Request, fit
from ..errors import DoesNotFitError, ModeUnavailableError, NoGPUError
from ..ledger import Ledger
from ..modes import NodeFacts
from ..preview import Preview, never, preview_start
from ..processes import is_alive
from ..slice_request import SliceRequest


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
    if isinstance(never_fits, Refusal) and not never_fits.retry:
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
    ahead = sum(1 for record in records if record.state == "queued" and is_alive(record.process))
    wanted = Request("", asked.owner, request.size, request.mode.placement, request.card)
    return preview_start(wanted, devices, asked.ledger.held(), ahead, asked.policy, asked.when_full)
