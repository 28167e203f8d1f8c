"""How long a queued start will wait (pure): the queue played forward with the real allocator."""

from __future__ import annotations

import pytest

from jupyter_gpushare.allocator import Held, Policy, Request
from jupyter_gpushare.inventory import parse_simulation
from jupyter_gpushare.sizes import parse_size
from jupyter_gpushare.wait_estimate import MIN_HISTORY, History, describe, expected_start

GiB = 2**30
CARD = parse_simulation("1xA100-80GB").devices[0]
NOW = 100_000.0


def held(kernel_id: str, gib: int) -> Held:
    return Held(kernel_id, "bob", CARD.uuid, CARD.uuid, gib * GiB)


def request(kernel_id: str, size: str) -> Request:
    return Request(kernel_id, "alice", parse_size(size))


HISTORY = History(tuple((40 * GiB, seconds) for seconds in (600, 1200, 1800, 2400, 3000)))


def test_no_history_no_estimate() -> None:
    few = History(HISTORY.holds[: MIN_HISTORY - 1])
    assert (
        expected_start(NOW, request("me", "40G"), [], [CARD], [held("a", 60)], {"a": NOW}, few, Policy())
        is None
    )


def test_the_start_waits_for_the_expected_end_of_the_slice_in_its_way() -> None:
    # A 60G slice held for 1000 s: of the holds longer than that (1200..3000), the median is
    # 2100, so it is expected to end in 1100 s; then the 40G request fits.
    start = expected_start(
        NOW, request("me", "40G"), [], [CARD], [held("a", 60)], {"a": NOW - 1000}, HISTORY, Policy()
    )
    assert start == pytest.approx(NOW + 1100)


def test_requests_ahead_take_the_freed_room_first() -> None:
    # Two 40G slices fill the card: a (held 600 s) is expected to end at +1500, b (new) at
    # +1800. The 40G request ahead takes the room a leaves; ours gets the room b leaves.
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 600, "b": NOW}
    ahead = [request("first", "40G")]
    start = expected_start(NOW, request("me", "40G"), ahead, [CARD], slices, since, HISTORY, Policy())
    assert start == pytest.approx(NOW + 1800)


def test_a_slice_older_than_every_hold_is_expected_to_last_as_long_again() -> None:
    assert HISTORY.remaining(40 * GiB, 5000) == 5000
    assert HISTORY.remaining(40 * GiB, 0) == 1800


def test_never_fitting_is_unknown() -> None:
    assert expected_start(NOW, request("me", "90G"), [], [CARD], [], {}, HISTORY, Policy()) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "unknown"),
        (20, "less than a minute"),
        (360, "about 6 min"),
        (5400, "about 1.5 h"),
        (36000, "about 10 h"),
    ],
)
def test_describe(seconds: float | None, text: str) -> None:
    assert describe(seconds) == text
