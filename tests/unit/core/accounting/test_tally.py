"""The accounting's arithmetic (pure): events folded into figures, exactly, bucket by bucket."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.core.accounting.tally import (
    DETAIL_SECONDS,
    Event,
    Figures,
    add_spans,
    fold,
    open_figures,
    pieces,
    recent_use,
    span_weight,
)

GiB = 2**30
T0 = 1_000_000 * DETAIL_SECONDS  # a bucket boundary


def event(at: float, what: str, **values: object) -> Event:
    return Event(T0 + at, "k1", "alice", what, **values)  # type: ignore[arg-type]


def total(buckets: dict[tuple[float, str, str], Figures]) -> Figures:
    summed = Figures()
    for figures in buckets.values():
        summed.add(figures)
    return summed


def test_a_session_queued_placed_resized_used_busy_suspended_resumed_and_ended() -> None:
    events = [
        event(0, "queued", path="a.ipynb", kernel_name="python3-gpu"),
        event(10, "placed", memory=4 * GiB, used=0),
        event(20, "busy"),
        event(30, "used", used=2 * GiB),
        event(50, "idle"),
        event(70, "resized", memory=8 * GiB),
        event(100, "ended", memory=8 * GiB),
        event(100, "suspended"),
        event(400, "unsuspended"),
        event(400, "queued"),
        event(405, "placed", memory=8 * GiB, used=2 * GiB),
        event(1000, "ended"),
    ]
    folded = fold({}, events)
    figures = total(folded.buckets)
    assert figures.reserved == pytest.approx(4 * GiB * 60 + 8 * GiB * 30 + 8 * GiB * 595)
    assert figures.used == pytest.approx(2 * GiB * 70 + 2 * GiB * 595)
    assert figures.busy == pytest.approx(30)
    assert figures.idle == pytest.approx(90 - 30 + 595)
    assert figures.suspended == pytest.approx(300)
    assert figures.queued == pytest.approx(10 + 5)
    assert (figures.starts, figures.suspends, figures.resumes) == (2, 1, 1)
    assert figures.wait == pytest.approx(15)
    assert [(h.memory, h.seconds) for h in folded.holds] == [(8 * GiB, 90), (8 * GiB, 595)]
    assert folded.accounts["k1"].phase == "gone"
    assert folded.accounts["k1"].path == "a.ipynb"
    assert (folded.accounts["k1"].kernel_name, folded.accounts["k1"].started_at) == ("python3-gpu", T0)


def test_a_placement_or_withdrawal_carries_its_wait_without_a_queued_event() -> None:
    events = [
        Event(T0 + 30, "k1", "alice", "placed", 2 * GiB, 0, "a.ipynb", requested_at=T0 + 10),
        Event(T0 + 50, "k1", "alice", "ended", 2 * GiB),
        Event(T0 + 90, "k2", "alice", "withdrawn", 0, requested_at=T0 + 60),
    ]
    figures = total(fold({}, events).buckets)
    assert (figures.queued, figures.wait, figures.starts) == (20 + 30, 20, 1)
    assert figures.reserved == 2 * GiB * 20


def test_a_resume_is_counted_when_its_slice_is_placed() -> None:
    events = [
        event(0, "placed", memory=GiB, requested_at=T0),
        event(10, "ended"),
        event(10, "suspended"),
        event(60, "unsuspended"),
        Event(T0 + 65, "k1", "alice", "placed", GiB, 0, requested_at=T0 + 60),
    ]
    figures = total(fold({}, events).buckets)
    assert (figures.suspends, figures.resumes, figures.starts) == (1, 1, 2)
    assert (figures.suspended, figures.queued, figures.wait) == (50, 5, 5)


def test_time_is_cut_exactly_at_bucket_boundaries() -> None:
    folded = fold({}, [event(0, "placed", memory=GiB), event(2.5 * DETAIL_SECONDS, "ended")])
    reserved = sorted((start - T0, f.reserved / GiB) for (start, _, _), f in folded.buckets.items())
    assert reserved == [(0, DETAIL_SECONDS), (DETAIL_SECONDS, DETAIL_SECONDS), (2 * DETAIL_SECONDS, 450)]


def test_a_failed_resume_going_back_to_sleep_is_not_a_new_suspension() -> None:
    events = [
        event(0, "placed", memory=GiB),
        event(10, "ended"),
        event(10, "suspended"),
        event(20, "unsuspended"),
        event(30, "withdrawn", requested_at=T0 + 20),  # the resume found no slice
        event(30, "suspended"),  # and the kernel stays suspended
    ]
    figures = total(fold({}, events).buckets)
    assert (figures.suspends, figures.resumes, figures.starts) == (1, 0, 1)
    assert figures.suspended == pytest.approx(10 + 0)
    assert figures.queued == pytest.approx(10)


def test_open_accounts_accrue_up_to_now_without_being_stored() -> None:
    folded = fold({}, [event(0, "placed", memory=2 * GiB, used=GiB)])
    assert total(folded.buckets).reserved == 0
    now = T0 + 100
    figures = total(open_figures(folded.accounts.values(), now))
    assert (figures.reserved, figures.used, figures.idle) == (200 * GiB, 100 * GiB, 100)
    # Folding later events continues from where the account stands, not from the start.
    later = fold(folded.accounts, [event(100, "ended")])
    assert total(later.buckets).reserved == 200 * GiB


def test_late_events_are_applied_where_the_account_stands() -> None:
    folded = fold({}, [event(0, "placed", memory=GiB), event(50, "busy")])
    late = fold(folded.accounts, [event(20, "idle")])  # reported after a fold had passed 50
    assert late.accounts["k1"].since == T0 + 50
    assert total(late.buckets).reserved == 0


@given(st.lists(st.floats(0, 5000), min_size=2, max_size=12))
def test_bucket_totals_are_the_integral_whatever_the_cuts(times: list[float]) -> None:
    times = sorted(times)
    events = [event(times[0], "placed", memory=GiB)]
    events += [event(at, "resized", memory=(i % 3 + 1) * GiB) for i, at in enumerate(times[1:-1])]
    events.append(event(times[-1], "ended"))
    expected = 0.0
    memory = GiB
    for i, at in enumerate(times[1:]):
        expected += memory * (at - times[i])
        memory = (i % 3 + 1) * GiB
    # Epoch seconds carry about 1e-7 s of precision: a few bytes x seconds per GiB.
    assert total(fold({}, events).buckets).reserved == pytest.approx(expected, rel=1e-9, abs=GiB * 1e-6)


@given(st.floats(-1e5, 1e5), st.floats(0, 1e5))
def test_pieces_cover_the_interval(start: float, length: float) -> None:
    cut = list(pieces(T0 + start, T0 + start + length))
    assert sum(seconds for _, seconds in cut) == pytest.approx(length, abs=1e-6)
    assert all(0 < seconds <= DETAIL_SECONDS for _, seconds in cut)


def test_decay_halves_every_half_life_and_adds_spans_as_they_count_then() -> None:
    half = 3600.0
    assert span_weight(0, half, half, half) == pytest.approx(half / math.log(2) * 0.5)
    value, at = add_spans(0.0, 0.0, [(0.0, 10.0, 1), (half, half + 10.0, 1)], half)
    assert at == half + 10.0
    assert value == pytest.approx(10 * 0.5 + 10, rel=1e-3)
    running = fold({}, [event(0, "placed", memory=GiB)]).accounts.values()
    usage = recent_use({"alice": (100.0, T0 - half)}, running, T0 + 60, half)
    assert usage["alice"] == pytest.approx(100 * 2 ** (-(half + 60) / half) + GiB * 60, rel=1e-2)
