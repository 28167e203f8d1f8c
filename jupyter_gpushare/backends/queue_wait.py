"""Waiting in the ledger's FIFO queue for a place: the rules a queued request lives by.

A request that does not fit now waits (``when_full = "queue"``) and asks again every
``queue_poll_interval`` seconds; it fails at once with ``when_full = "fail"``, fails with the
reason after ``queue_timeout``, and fails if it is withdrawn while it waits. Whoever waits is told
each new queue position. The caller withdraws the request whenever this does not return a slice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..allocator import Policy
from ..config import GPUShare
from ..errors import DoesNotFitError, QueueTimeoutError
from ..ledger import Ledger
from ..records import Outcome, Placed, Refused, SliceRecord, Waiting

WaitCallback = Callable[[int, str], None]

log = logging.getLogger("jupyter_gpushare")


async def wait_for_place(
    first: Outcome,
    *,
    kernel_id: str,
    size: str,
    ledger: Ledger,
    policy: Callable[[], Policy],
    settings: GPUShare,
    on_wait: WaitCallback | None = None,
) -> SliceRecord:
    """The slice once ``kernel_id``'s request is placed, starting from its ``first`` outcome;
    raises with the reason when it is refused, times out or is withdrawn."""
    started = time.monotonic()
    last_position: int | None = None
    outcome = first
    while True:
        if isinstance(outcome, Placed):
            if last_position is not None:
                log.info(
                    "GPU slice for kernel %s placed after %.1f s in the queue",
                    kernel_id,
                    time.monotonic() - started,
                )
            return outcome.record
        if isinstance(outcome, Refused):
            raise DoesNotFitError(outcome.reason)
        assert isinstance(outcome, Waiting)
        if settings.when_full == "fail":
            raise DoesNotFitError(outcome.reason)
        waited = time.monotonic() - started
        if waited >= settings.queue_timeout:
            raise QueueTimeoutError(
                f"no GPU slice after waiting {waited:.0f} s (queue position "
                f"{outcome.position}): {outcome.reason}"
            )
        if outcome.position != last_position:
            last_position = outcome.position
            log.info(
                "GPU request %s for kernel %s queued at position %d: %s",
                size,
                kernel_id,
                outcome.position,
                outcome.reason,
            )
            if on_wait is not None:
                on_wait(outcome.position, outcome.reason)
        await asyncio.sleep(settings.queue_poll_interval)
        try:
            outcome = await asyncio.to_thread(ledger.try_place, kernel_id, policy())
        except LookupError:
            # Released while queued (a user withdrew it, or reconciliation): a refusal.
            raise DoesNotFitError(
                f"the GPU request of kernel {kernel_id} was withdrawn while it waited"
            ) from None
