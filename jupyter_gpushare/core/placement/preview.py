"""What a start would do, without starting: the answer of ``GET api/gpushare/fit``. Pure.

The start picker shows, for every size it offers, whether the kernel would start now and
where, wait in the queue and at which position, or never run and why. The answer comes from
:func:`jupyter_gpushare.core.placement.allocator.fit` with the inputs the ledger gives a real start (the
devices, the slices held, the live requests queued ahead, the policy), so the dialog and the
start it leads to agree. The Kubernetes backend's counterpart is
:mod:`jupyter_gpushare.backends.kubernetes.objects.preview`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.placement.allocator import (
    KERNEL_LIMIT,
    TOO_LARGE,
    USER_LIMIT,
    Held,
    Policy,
    Request,
    Spot,
    fit,
    free_memory,
)
from jupyter_gpushare.core.placement.wait_estimate import describe
from jupyter_gpushare.core.sizes import format_bytes

# now: it would start at once; queue: it would wait (position given); full: no room now and this
# server does not queue (``when_full = "fail"``); never: waiting cannot help.
Verdict = Literal["now", "queue", "full", "never"]


@dataclass(frozen=True)
class Preview:
    """What a start of one size would do now."""

    verdict: Verdict
    summary: str  # a few words for the picker: "fits now on GPU1, 36G free", "queue position 2"
    reason: str | None = None  # the sentence the start itself would give when it waits or fails
    device: int | None = None  # where it would run (a device index)
    node: str | None = None  # the Kubernetes node where it would run
    free: int | None = None  # bytes free there now
    memory: int | None = None  # bytes it would hold there
    queue_position: int | None = None
    # A start that would wait: when it is expected to be placed (seconds since the epoch; None
    # where nothing is known). Only the local backend estimates it.
    expected_start: float | None = None

    def as_json(self, size: str) -> dict[str, Any]:
        """One entry of ``GET fit`` (the ``Fit`` schema of openapi.yaml)."""
        return {
            "gpu_memory": size,
            "verdict": self.verdict,
            "summary": self.summary,
            "reason": self.reason,
            "device": self.device,
            "node": self.node,
            "free": self.free,
            "memory_request": self.memory,
            "queue_position": self.queue_position,
            "expected_start": self.expected_start,
        }


def never(reason: str, summary: str | None = None) -> Preview:
    """A start that can never succeed as asked (no GPU, a mode this node cannot honour…)."""
    return Preview("never", summary or reason, reason)


# When a start that would wait is expected to be placed, and the time now (the local backend's
# estimate, asked for only when the start would wait).
Estimate = Callable[[], tuple[float | None, float]]


def waiting(position: int, reason: str, when_full: str, estimate: Estimate | None = None) -> Preview:
    """A start that finds no room now: queued at ``position`` (with how long it is expected to
    wait, where ``estimate`` says), or refused where nothing queues."""
    if when_full == "fail":
        return Preview("full", "no room now", reason)
    summary = f"queue position {position}"
    expected = None
    if estimate is not None:
        expected, now = estimate()
        summary += f", wait {describe(None if expected is None else expected - now)}"
    return Preview("queue", summary, reason, queue_position=position, expected_start=expected)


def preview_start(
    request: Request,
    devices: Sequence[Device],
    held: Sequence[Held],
    queued_ahead: int,
    policy: Policy,
    when_full: str = "queue",
    *,
    why_ahead: str | None = None,
    estimate: Estimate | None = None,
) -> Preview:
    """What starting ``request`` would do now.

    ``queued_ahead`` is the number of live requests that would be served before it (all those
    queued under first in, first out; under fair share, ``why_ahead`` says why those): the queue
    is head-of-line, so a request that would fit still waits behind them. ``estimate``: when a
    start that would wait is expected to be placed (see :func:`waiting`).
    """
    outcome = fit(request, devices, held, policy)
    if isinstance(outcome, Spot):
        if queued_ahead:
            plural = "s" if queued_ahead > 1 else ""
            why = why_ahead or f"behind {queued_ahead} earlier GPU request{plural}"
            return waiting(queued_ahead + 1, why, when_full, estimate)
        device = next(d for d in devices if d.uuid == outcome.device_uuid)
        free = free_memory(device, held, policy.overcommit)
        where = device.label
        if outcome.unit_uuid != outcome.device_uuid:
            profile = next((m.profile for m in device.mig if m.uuid == outcome.unit_uuid), "MIG")
            where = f"{device.label} (MIG {profile})"
            free = outcome.memory
        return Preview(
            "now",
            f"fits now on {where}, {format_bytes(free)} free",
            device=device.index,
            free=free,
            memory=outcome.memory,
        )
    if outcome.retry:
        # Under fair share, why it stands where it stands comes first; then why it waits at all.
        reason = f"{why_ahead}; {outcome.reason}" if why_ahead and queued_ahead else outcome.reason
        return waiting(queued_ahead + 1, reason, when_full, estimate)
    return never(outcome.reason, _never_summary(outcome.code, request.owner, held, policy))


def _never_summary(code: str, owner: str, held: Sequence[Held], policy: Policy) -> str | None:
    """The picker's few words for a refusal that waiting cannot change."""
    if code == TOO_LARGE:
        return "larger than any card"
    if code == KERNEL_LIMIT and policy.max_memory_per_kernel is not None:
        return f"above the {format_bytes(policy.max_memory_per_kernel)} limit per kernel"
    if code == USER_LIMIT and policy.max_memory_per_user is not None:
        in_use = sum(slice_.memory for slice_ in held if slice_.owner == owner)
        return budget_summary(policy.max_memory_per_user, in_use)
    return None


def budget_summary(limit: int, held: int) -> str:
    """``above your 16G budget: 12G already held``."""
    return f"above your {format_bytes(limit)} budget: {format_bytes(held)} already held"
