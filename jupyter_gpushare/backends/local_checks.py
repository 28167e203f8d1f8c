"""The local backend's answers before anything is reserved: a start's request checked against the
node (``check``), and what a start would do now (``preview``, for ``GET fit`` and the start
picker). Both read the same ledger and make the same placement a start makes; neither writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..allocator import Policy, Refusal, Request, fit
from ..devices import Device
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


def cards_large_enough(devices: list[Device], least: int) -> list[str]:
    """The devices an exclusive request of a size (``least`` bytes) may be placed on; the queue
    keeps them with the request (``only_devices``), so a card too small is never taken."""
    return [device.uuid for device in devices if device.memory_total >= least]


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
