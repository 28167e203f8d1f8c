"""Who of the waiting requests goes first: fifo and fair share (pure), with property tests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.core.placement.queue_order import QueueRule, Waiter, ahead_of, line_up, why_waiting
from jupyter_gpushare.core.sizes import GiB

FAIR = QueueRule("fair", half_life=3600.0, age_bound=120.0)
NOW = 10_000.0
HOUR = 3600.0


def waiter(kernel_id: str, owner: str, seq: int, age: float = 0.0) -> Waiter:
    return Waiter(kernel_id, owner, seq, NOW - age)


def test_fifo_is_the_order_of_arrival_whatever_the_use() -> None:
    waiters = [waiter("b", "bob", 2), waiter("a", "alice", 1), waiter("c", "carol", 3)]
    order = line_up(waiters, {"alice": 1e15, "bob": 0.0}, NOW)
    assert [w.kernel_id for w in order] == ["a", "b", "c"]


def test_fair_puts_the_user_with_the_least_recent_use_first_and_keeps_each_users_order() -> None:
    bob = [waiter(f"bob{i}", "bob", i) for i in range(1, 6)]
    alice = waiter("alice1", "alice", 6)
    usage = {"bob": 4 * GiB * 60.0}  # bob's first four ran for a minute; alice has used nothing
    order = line_up([*bob, alice], usage, NOW, FAIR)
    assert [w.kernel_id for w in order] == ["alice1", "bob1", "bob2", "bob3", "bob4", "bob5"]


def test_fair_ties_go_in_the_order_of_arrival() -> None:
    order = line_up([waiter("b", "bob", 2), waiter("a", "alice", 1)], {}, NOW, FAIR)
    assert [w.kernel_id for w in order] == ["a", "b"]


def test_fair_serves_requests_older_than_the_age_bound_first_in_arrival_order() -> None:
    heavy_old = waiter("old", "heavy", 1, age=121.0)
    light_new = waiter("new", "light", 2, age=5.0)
    order = line_up([light_new, heavy_old], {"heavy": 1e15}, NOW, FAIR)
    assert [w.kernel_id for w in order] == ["old", "new"]


def test_a_previewed_start_stands_behind_lighter_users_and_ahead_of_heavier_ones() -> None:
    queued = [waiter("h", "heavy", 1), waiter("l", "light", 2)]
    me = Waiter("", "middle", 3, NOW)
    usage = {"heavy": 100.0, "middle": 50.0, "light": 1.0}
    assert [w.kernel_id for w in ahead_of(me, queued, usage, NOW, FAIR)] == ["l"]


def test_the_reasons_say_why_under_each_policy() -> None:
    me = waiter("me", "alice", 5)
    ahead = [waiter("x", "bob", 1, age=200.0), waiter("y", "carol", 2), waiter("z", "alice", 3)]
    assert why_waiting(me, ahead[:1], {}, NOW) == "behind 1 earlier GPU request"
    assert why_waiting(me, ahead, {}, NOW) == "behind 3 earlier GPU requests"
    fair = why_waiting(me, ahead, {"alice": 2 * GiB * HOUR}, NOW, FAIR)
    assert fair == (
        "behind 3 GPU requests under fair share (1 waiting longer than 2 min (served in arrival "
        "order), 1 of users with less recent GPU use, 1 earlier of your own); your recent use: "
        "2.0 GiB·h, halving every 1 h"
    )


# ---- properties -------------------------------------------------------------------------------------

OWNERS = ("alice", "bob", "carol", "dan")
# Requests arrive in order: the later made (higher seq), the younger.
waiters_strategy = st.lists(
    st.tuples(st.sampled_from(OWNERS), st.floats(0, 600)), min_size=0, max_size=25
).map(
    lambda items: [
        Waiter(f"k{i}", owner, i, NOW - age)
        for i, (owner, age) in enumerate(
            zip([o for o, _ in items], sorted((a for _, a in items), reverse=True), strict=True)
        )
    ]
)
usage_strategy = st.dictionaries(st.sampled_from(OWNERS), st.floats(0, 1e16))


@given(waiters_strategy, usage_strategy)
def test_fair_order_is_a_permutation_fifo_within_a_user_aged_first_then_by_use(
    waiters: list[Waiter], usage: dict[str, float]
) -> None:
    order = line_up(waiters, usage, NOW, FAIR)
    assert sorted(w.kernel_id for w in order) == sorted(w.kernel_id for w in waiters)
    for owner in OWNERS:
        own = [w.seq for w in order if w.owner == owner]
        assert own == sorted(own)  # a user's requests in the order they were made
    aged = [NOW - w.requested_at >= FAIR.age_bound for w in order]
    assert aged == sorted(aged, reverse=True)  # every old request before every young one
    old = [w.seq for w in order if NOW - w.requested_at >= FAIR.age_bound]
    assert old == sorted(old)  # the old ones in arrival order
    young = [usage.get(w.owner, 0.0) for w in order if NOW - w.requested_at < FAIR.age_bound]
    assert young == sorted(young)  # the others, the least recent use first


@given(
    st.lists(st.sampled_from(OWNERS), min_size=1, max_size=12),
    st.lists(st.sampled_from(OWNERS), min_size=0, max_size=60),
    st.dictionaries(st.sampled_from(OWNERS), st.floats(0, 1e16)),
)
def test_no_start_starves_whoever_keeps_arriving(
    first: list[str], stream: list[str], usage: dict[str, float]
) -> None:
    """One place frees every 30 s while new requests keep coming, each from anyone (the lightest
    users included): every request waiting at the start is served within the age bound plus
    one round per request older than it."""
    step = 30.0
    clock = NOW
    queue = [Waiter(f"first{i}", owner, i, clock) for i, owner in enumerate(first)]
    seq = len(queue)
    served_at: dict[str, float] = {}
    arrivals = iter(stream)
    while any(w.kernel_id.startswith("first") for w in queue):
        for _ in range(2):  # two arrivals per freed place: the queue grows
            owner = next(arrivals, None)
            if owner is not None:
                queue.append(Waiter(f"new{seq}", owner, seq, clock))
                seq += 1
        head = line_up(queue, usage, clock, FAIR)[0]
        queue.remove(head)
        served_at[head.kernel_id] = clock
        clock += step
    for i in range(len(first)):
        bound = FAIR.age_bound + step * (i + 1) + step
        assert served_at[f"first{i}"] - NOW <= bound
