"""The tests' one polling helper (tests/polling.py): it returns what it waited for, and a wait
that never ends fails the test with what it waited for and the last value read."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import async_wait_until, wait_until


def test_wait_until_returns_the_first_true_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", 5, 0.001) == "ready"


def test_until_checks_the_value_read_and_the_value_is_returned() -> None:
    counter = itertools.count()
    assert wait_until(lambda: {"n": next(counter)}, 5, 0.001, until=lambda value: value["n"] == 2) == {"n": 2}


def test_a_condition_never_reached_fails_with_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(
        AssertionError, match=r"^the pod running not reached within 0\.05 s; last value: 'Pending'$"
    ):
        wait_until(lambda: "Pending", 0.05, 0.01, "the pod running", until=lambda phase: phase == "Running")


async def test_the_async_twin_awaits_coroutine_conditions_and_returns_their_value() -> None:
    counter = itertools.count()

    async def alive() -> bool:
        return next(counter) < 3

    assert await async_wait_until(alive, 5, 0.001, until=lambda value: not value) is False
    assert await async_wait_until(lambda: next(counter), 5, 0.001) == 4


async def test_the_async_twin_fails_like_the_sync_one() -> None:
    with pytest.raises(
        AssertionError, match=r"^the kernel ended not reached within 0\.05 s; last value: True$"
    ):
        await async_wait_until(lambda: True, 0.05, 0.01, "the kernel ended", until=lambda alive: not alive)
