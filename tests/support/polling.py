"""Waiting for a condition, the one way the tests do it (tests/unit/test_polling.py checks that
no wait loop of the tests or benchmarks goes without a deadline).

A test that waits for something to happen elsewhere (a kernel process, a server, the simulated
cluster, the monitor thread) polls for the state it expects with :func:`wait_until`, or with
:func:`async_wait_until` from a coroutine — never a fixed sleep. Both return what the condition
returned, so a test can go on with the value it waited for, and fail with what they waited for
and the last value read.

``until`` separates reading from checking where the value itself is what the test wants::

    pool = wait_until(lambda: get(server, "pool"), 20, message="four nodes",
                      until=lambda pool: len(pool["devices"]) == 4)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "the condition",
    *,
    until: Callable[[T], object] = bool,
    sleep: Callable[[float], object] | None = None,
) -> T:
    """Call ``condition()`` every ``interval`` seconds until ``until`` holds for its value (by
    default: until the value is true), and return that value; fail the test after ``timeout``.
    ``sleep`` replaces ``time.sleep`` between two calls where something must keep running while
    the test waits (a Playwright page delivers its events only inside its own calls)."""
    deadline = time.monotonic() + timeout
    while not until(value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(_not_reached(message, timeout, value))
        (sleep or time.sleep)(interval)
    return value


async def async_wait_until(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "the condition",
    *,
    until: Callable[[T], object] = bool,
) -> T:
    """:func:`wait_until` for a coroutine: sleeps without blocking the event loop, and awaits
    the condition's value where the condition is a coroutine function (``kernel.is_alive``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if until(value):  # type: ignore[arg-type]
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(_not_reached(message, timeout, value))
        await asyncio.sleep(interval)


def _not_reached(message: str, timeout: float, value: object) -> str:
    shown = repr(value)
    if len(shown) > 500:
        shown = shown[:500] + "…"
    return f"{message} not reached within {timeout:g} s; last value: {shown}"
