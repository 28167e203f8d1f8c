"""Waiting in the FIFO queue for a place: the rules every local kernel's start lives by, whether it
asks the node ledger itself or a broker.

A request that does not fit now is asked about again every ``queue_poll_interval`` seconds; the
backend answering ``poll`` applies ``when_full`` and ``queue_timeout``. Whoever waits is told each
new queue position, and whatever ends the wait early withdraws the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from jupyter_gpushare.backends.protocol import WaitCallback
from jupyter_gpushare.core.errors import DoesNotFitError, QueueTimeoutError
from jupyter_gpushare.core.records import Outcome, Placed, Refused, SliceRecord, Waiting
from jupyter_gpushare.core.slice_request import SliceRequest

log = logging.getLogger("jupyter_gpushare")


def settle(outcome: Waiting, waited: float, when_full: str, queue_timeout: float) -> Outcome:
    """What a request still waiting after ``waited`` seconds is now: refused at once when the
    pool is full and ``when_full = "fail"``, refused as timed out after ``queue_timeout``."""
    if when_full == "fail":
        return Refused(outcome.reason)
    if waited >= queue_timeout:
        return Refused(
            f"no GPU slice after waiting {waited:.0f} s (queue position {outcome.position}): "
            f"{outcome.reason}",
            timed_out=True,
        )
    return outcome


async def wait_for_slice(
    kernel_id: str,
    request: SliceRequest,
    first: Outcome,
    poll: Callable[[], Awaitable[Outcome]],
    withdraw: Callable[[], Awaitable[object]],
    interval: float,
    on_wait: WaitCallback | None = None,
) -> SliceRecord:
    """Wait in the queue until ``first`` (then each ``poll()``) is placed; raise with the reason
    when refused. Whatever ends the wait early — a refusal, cancellation — ``withdraw``s the
    request. The waiting of a local kernel's start, through the ledger or through a broker."""
    started = time.monotonic()
    last_position: int | None = None
    placed = False
    try:
        outcome = first
        while True:
            if isinstance(outcome, Placed):
                placed = True
                if last_position is not None:
                    log.info(
                        "GPU slice for kernel %s placed after %.1f s in the queue",
                        kernel_id,
                        time.monotonic() - started,
                    )
                return outcome.record
            if isinstance(outcome, Refused):
                if outcome.timed_out:
                    raise QueueTimeoutError(outcome.reason)
                raise DoesNotFitError(outcome.reason)
            assert isinstance(outcome, Waiting)
            if outcome.position != last_position:
                last_position = outcome.position
                log.info(
                    "GPU request %s for kernel %s queued at position %d: %s",
                    request.size,
                    kernel_id,
                    outcome.position,
                    outcome.reason,
                )
                if on_wait is not None:
                    on_wait(outcome.position, outcome.reason)
            await asyncio.sleep(interval)
            outcome = await poll()
    finally:
        if not placed:
            await withdraw()
