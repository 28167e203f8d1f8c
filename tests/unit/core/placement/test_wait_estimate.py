"""How long a queued start will wait (pure): the queue played forward with the real allocator."""

from __future__ import annotations

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.core.placement.allocator import Held, Policy, Request
from jupyter_gpushare.core.placement.wait_estimate import (
    JUDGED,
    JUDGED_MIN,
    JUDGED_RECENT,
    MIN_HISTORY,
    History,
    Judged,
    describe,
    estimates,
    expected_start,
    model_holds,
    naive_start,
    trusts_model,
)
from jupyter_gpushare.core.sizes import parse_size

GiB = 2**30
CARD = parse_simulation("1xA100-80GB").devices[0]
NOW = 100_000.0


def held(kernel_id: str, gib: int) -> Held:
    return Held(kernel_id, "bob", CARD.uuid, CARD.uuid, gib * GiB)


def request(kernel_id: str, size: str) -> Request:
    return Request(kernel_id, "alice", parse_size(size))


HISTORY = History(tuple((40 * GiB, seconds) for seconds in (600, 1200, 1800, 2400, 3000)))
# Every slice was held exactly 30 min: the plays all agree.
EXACT = History(tuple((40 * GiB, 1800.0) for _ in range(10)))
# Holds spread evenly from a minute to about 3 h.
SPREAD = History(tuple((10 * GiB, 60.0 * minutes) for minutes in range(1, 200, 2)))


def test_no_history_no_estimate() -> None:
    few = History(HISTORY.holds[: MIN_HISTORY - 1])
    slices = [held("a", 60)]
    assert expected_start(NOW, request("me", "40G"), [], [CARD], slices, {"a": NOW}, few, Policy()) is None


def test_the_start_waits_for_the_end_of_the_slice_in_its_way() -> None:
    # A 60G slice held for 1000 s, and slices are held 1800 s: it ends in 800 s, then 40G fits.
    slices = [held("a", 60)]
    start = expected_start(NOW, request("me", "40G"), [], [CARD], slices, {"a": NOW - 1000}, EXACT, Policy())
    assert start == pytest.approx(NOW + 800)


def test_requests_ahead_take_the_freed_room_first() -> None:
    # Two 40G slices fill the card: a (held 600 s) ends at +1200, b (new) at +1800. The 40G
    # request ahead takes the room a leaves; ours gets the room b leaves.
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 600, "b": NOW}
    ahead = [request("first", "40G")]
    start = expected_start(NOW, request("me", "40G"), ahead, [CARD], slices, since, EXACT, Policy())
    assert start == pytest.approx(NOW + 1800)


def test_the_first_of_many_slices_ends_sooner_than_any_one_is_expected_to() -> None:
    slices = [Held(f"s{i}", "bob", CARD.uuid, CARD.uuid, 10 * GiB) for i in range(8)]
    since = {f"s{i}": NOW for i in range(8)}
    start = expected_start(NOW, request("me", "10G"), [], [CARD], slices, since, SPREAD, Policy())
    assert start is not None
    one = SPREAD.remaining(10 * GiB, 0.0)  # the median hold: about 100 min
    assert start - NOW < one / 3  # the first of eight ends far sooner
    # Behind five more requests it comes later; the answer is the same every time it is asked.
    behind = [request(f"r{i}", "10G") for i in range(5)]
    later = expected_start(NOW, request("me", "10G"), behind, [CARD], slices, since, SPREAD, Policy())
    assert later is not None and later > start
    assert later == expected_start(NOW, request("me", "10G"), behind, [CARD], slices, since, SPREAD, Policy())


def test_a_slice_older_than_every_hold_is_as_likely_to_end_within_as_long_again() -> None:
    assert HISTORY.remaining(40 * GiB, 5000) == 5000
    assert HISTORY.remaining(40 * GiB, 5000, 0.25) == pytest.approx(5000 / 3)
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


def days_of_a_class(days: int) -> History:
    """Each day nine 8G slices start 100 s apart and all end together at 1000 s (a class ends):
    holds of 200-1000 s, but none ends on its own clock."""
    holds, ended = [], []
    for day in range(days):
        for i in range(9):
            holds.append((8 * GiB, 1000.0 - 100 * i))
            ended.append(NOW - (days - day) * 10_000 + 1000)
    return History(tuple(holds), tuple(ended))


def staggered(count: int) -> History:
    """Slices of 30 min, one starting every 5 min: each ends on its own clock."""
    holds = tuple((8 * GiB, 1800.0) for _ in range(count))
    starts = [NOW - 2400 - 300 * (count - 1 - i) for i in range(count)]  # the last ended 600 s ago
    return History(holds, tuple(start + 1800 for start in starts))


def test_the_naive_estimate_is_the_place_in_line_times_the_median_hold_per_card() -> None:
    cards = parse_simulation("4xA100-80GB").devices
    assert naive_start(NOW, 2, cards, SPREAD) == pytest.approx(NOW + 3 * SPREAD.median() / 4)
    assert naive_start(NOW, 0, cards, History(SPREAD.holds[: MIN_HISTORY - 1])) is None


def test_where_past_holds_did_not_tell_when_slices_ended_the_estimate_is_the_naive_one() -> None:
    history = days_of_a_class(5)
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 600, "b": NOW - 300}
    assert not model_holds(NOW, 1, [CARD], slices, since, history)
    start = expected_start(NOW, request("me", "40G"), [], [CARD], slices, since, history, Policy())
    # The median hold is 600 s; first in line on one card.
    assert start == pytest.approx(NOW + 600)


def test_where_past_holds_told_when_slices_ended_the_queue_is_played() -> None:
    history = staggered(30)
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 1500, "b": NOW - 300}
    assert model_holds(NOW, 1, [CARD], slices, since, history)
    start = expected_start(NOW, request("me", "40G"), [], [CARD], slices, since, history, Policy())
    assert start == pytest.approx(NOW + 300)  # a ends 1800 s after its start; naive: 1800 s
    # Without end times the model cannot be checked, and is trusted.
    assert model_holds(NOW, 1, [CARD], slices, since, History(history.holds))


def placed(count: int, model_error: float, naive_error: float) -> tuple[Judged, ...]:
    """``count`` placed starts whose kept estimates were off by these many seconds (the model's
    late, the naive one early)."""
    times = (NOW - 100.0 * (count - i) for i in range(count))
    return tuple(Judged(at + model_error, at - naive_error, at) for at in times)


def test_where_the_model_erred_more_on_placed_starts_the_estimate_is_the_naive_one() -> None:
    # The past holds say the model holds (its queue play: +300 s)...
    history = staggered(30)
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 1500, "b": NOW - 300}
    assert model_holds(NOW, 1, [CARD], slices, since, history)
    # ...but on the starts placed since, its estimates erred more than the naive ones.
    judged = History(history.holds, history.ended_at, placed(JUDGED_MIN, 300.0, 200.0))
    assert not trusts_model(NOW, 1, [CARD], slices, since, judged)
    start = expected_start(NOW, request("me", "40G"), [], [CARD], slices, since, judged, Policy())
    assert start == pytest.approx(NOW + 1800)  # naive: the median hold of 30 min, one card
    both = estimates(NOW, request("me", "40G"), [], [CARD], slices, since, judged, Policy())
    assert (both.model, both.naive, both.answer) == (pytest.approx(NOW + 300), start, start)
    # Too few placed starts to judge by: the check on the past holds decides, as before.
    few = History(history.holds, history.ended_at, placed(JUDGED_MIN - 1, 300.0, 200.0))
    assert expected_start(
        NOW, request("me", "40G"), [], [CARD], slices, since, few, Policy()
    ) == pytest.approx(NOW + 300)


def test_where_the_model_erred_less_on_placed_starts_the_queue_is_played() -> None:
    # The past holds say the model does not hold (a class: all end together)...
    history = days_of_a_class(5)
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 600, "b": NOW - 300}
    assert not model_holds(NOW, 1, [CARD], slices, since, history)
    # ...but the starts placed since were told better by it than by the naive estimate.
    judged = History(history.holds, history.ended_at, placed(JUDGED_MIN, 100.0, 900.0))
    assert trusts_model(NOW, 1, [CARD], slices, since, judged)
    start = expected_start(NOW, request("me", "40G"), [], [CARD], slices, since, judged, Policy())
    both = estimates(NOW, request("me", "40G"), [], [CARD], slices, since, judged, Policy())
    assert start == both.model == both.answer != both.naive
    assert both.naive == pytest.approx(NOW + 600)


def test_the_model_answers_only_where_both_the_long_and_the_recent_record_favour_it() -> None:
    history = staggered(30)
    slices = [held("a", 40), held("b", 40)]
    since = {"a": NOW - 1500, "b": NOW - 300}
    model_nearer = placed(JUDGED - JUDGED_RECENT, 100.0, 900.0)
    naive_nearer = placed(JUDGED_RECENT, 300.0, 200.0)

    def trusted(judged: tuple[Judged, ...]) -> bool:
        return trusts_model(NOW, 1, [CARD], slices, since, History(history.holds, history.ended_at, judged))

    # The model was nearer on most placed starts, the naive estimate on the recent ones: naive.
    assert not trusted(model_nearer + naive_nearer)
    # Nearer lately, but not over the long record: naive.
    assert not trusted(placed(JUDGED - JUDGED_RECENT, 300.0, 200.0) + placed(JUDGED_RECENT, 100.0, 900.0))
    # Nearer on both: the model.
    assert trusted(model_nearer + placed(JUDGED_RECENT, 100.0, 900.0))
    # Starts judged before the last JUDGED are forgotten.
    assert trusted(placed(3 * JUDGED, 300.0, 200.0) + model_nearer + placed(JUDGED_RECENT, 100.0, 900.0))


# What a GPU broker's accounting recorded of a scripted sequence on Kueue's quota (two slots;
# 40G kernels held 12 s, 4G ones 4 s; benchmarks/kueue_wait.py --keep): (GiB, seconds, ended at).
# Each look's events share one time, so a round's holders end as the next round's begin.
BROKER_HOLDS = [
    (40, 12.006937503814697, 1796614399.7440114),
    (40, 12.006937503814697, 1796614399.7440114),
    (4, 4.0022759437561035, 1796614409.750998),
    (40, 14.01635456085205, 1796614423.767981),
    (40, 14.01635456085205, 1796614423.767981),
    (4, 4.0035436153411865, 1796614427.7719827),
    (40, 12.006562232971191, 1796614439.7789984),
    (40, 12.006562232971191, 1796614439.7789984),
    (4, 4.002574682235718, 1796614443.7819943),
    (4, 4.0025622844696045, 1796614449.7910142),
    (4, 4.0025622844696045, 1796614449.7910142),
    (4, 4.002287864685059, 1796614453.79401),
    (4, 4.004549264907837, 1796614457.7990174),
    (4, 4.003950834274292, 1796614461.803019),
    (40, 12.01251220703125, 1796614465.8069804),
    (40, 12.010090112686157, 1796614477.8170137),
    (40, 12.010090112686157, 1796614477.8170137),
    (4, 4.001590013504028, 1796614481.8190038),
]


def test_a_hold_that_ended_as_another_began_is_not_checked_as_held_then() -> None:
    """A 40G hold ended (1796614465.80698) as the next round's began (their start, their end
    less their length, 57 µs earlier): it was not held then. Counted as held, ending at once, it made
    the check a coin toss between two estimates that both said 2 s (the model 2.0038 s off, the
    naive one 2.0021 s) and the naive estimate was told behind two 40G kernels."""
    history = History(
        tuple((gib * GiB, seconds) for gib, seconds, _ in BROKER_HOLDS),
        tuple(ended for _, _, ended in BROKER_HOLDS),
    )
    slots = parse_simulation("2xA100-80GB").devices
    assert model_holds(1796614485.0, 1, slots, [], {}, history)
