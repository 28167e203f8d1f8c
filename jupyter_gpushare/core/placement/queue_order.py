"""The order of the queue: first come, first served, or fair share. Pure.

Whatever the order, the queue is head-of-line: only the first request in line may be placed, and
while it does not fit everyone behind it waits (a large request is never starved by a stream of
small ones). What the policy decides is who is first.

* ``fifo``: the order requests were made in.
* ``fair``: the request of the user with the least recent GPU use goes first — reserved memory
  over time, GiB·hours, each hour counting half as much every ``half_life`` seconds (the
  decayed figure comes from the accounting, :mod:`jupyter_gpushare.core.accounting.tally`). A user's own
  requests keep the order they were made in. No request is held back by fair share for longer
  than ``age_bound`` seconds: once that old, it is served in arrival order ahead of every
  younger request, so nobody starves.

The same functions order the node ledger's queue, the positions every view shows, the start
picker's dry run and the replay benchmark's queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from jupyter_gpushare.core.sizes import GiB

QueuePolicy = Literal["fifo", "fair"]
QUEUE_POLICIES: tuple[QueuePolicy, ...] = ("fifo", "fair")
HOUR = 3600.0


@dataclass(frozen=True)
class QueueRule:
    """How the queue is ordered (``GPUShare.queue_policy``, ``fair_share_half_life``,
    ``queue_age_bound``)."""

    policy: QueuePolicy = "fifo"
    half_life: float = 86400.0  # seconds for a past GiB·hour to count half as much
    age_bound: float = 120.0  # seconds after which a request is served in arrival order

    @property
    def fair(self) -> bool:
        return self.policy == "fair"


FIFO = QueueRule()


@dataclass(frozen=True)
class Waiter:
    """A request waiting in the queue, as the order sees it."""

    kernel_id: str
    owner: str
    seq: int  # arrival order
    requested_at: float  # seconds since the epoch


def line_up(
    waiters: Iterable[Waiter], usage: Mapping[str, float], now: float, rule: QueueRule = FIFO
) -> list[Waiter]:
    """``waiters`` in the order they are served.

    ``usage``: each owner's decayed reserved byte-seconds now (absent: none). Under ``fair``,
    requests older than ``age_bound`` come first in arrival order, then the others by their
    owner's usage, ties (and a user's own requests) in arrival order.
    """
    arrival = sorted(waiters, key=lambda waiter: waiter.seq)
    if not rule.fair:
        return arrival
    aged = [waiter for waiter in arrival if now - waiter.requested_at >= rule.age_bound]
    young = [waiter for waiter in arrival if now - waiter.requested_at < rule.age_bound]
    return aged + sorted(young, key=lambda waiter: (usage.get(waiter.owner, 0.0), waiter.seq))


def ahead_of(
    me: Waiter, waiters: Iterable[Waiter], usage: Mapping[str, float], now: float, rule: QueueRule = FIFO
) -> list[Waiter]:
    """The requests served before ``me`` (which may or may not be among ``waiters`` yet: a start
    that is only being previewed is placed as if it arrived now)."""
    others = [waiter for waiter in waiters if waiter.kernel_id != me.kernel_id]
    order = line_up([*others, me], usage, now, rule)
    return order[: order.index(me)]


def gib_hours(byte_seconds: float) -> float:
    return byte_seconds / GiB / HOUR


def why_waiting(
    me: Waiter, ahead: Sequence[Waiter], usage: Mapping[str, float], now: float, rule: QueueRule = FIFO
) -> str:
    """Why ``me`` waits behind ``ahead``: the sentence the queue position comes with."""
    count = len(ahead)
    plural = "s" if count != 1 else ""
    if not rule.fair:
        return f"behind {count} earlier GPU request{plural}"
    old = own = lighter = 0
    for waiter in ahead:
        if now - waiter.requested_at >= rule.age_bound:
            old += 1
        elif waiter.owner == me.owner:
            own += 1
        else:
            lighter += 1
    parts = []
    if old:
        parts.append(f"{old} waiting longer than {_duration(rule.age_bound)} (served in arrival order)")
    if lighter:
        parts.append(f"{lighter} of users with less recent GPU use")
    if own:
        parts.append(f"{own} earlier of your own")
    mine = gib_hours(usage.get(me.owner, 0.0))
    return (
        f"behind {count} GPU request{plural} under fair share ({', '.join(parts)}); your recent use: "
        f"{mine:.1f} GiB·h, halving every {_duration(rule.half_life)}"
    )


def _duration(seconds: float) -> str:
    if seconds >= HOUR and seconds % HOUR == 0:
        hours = int(seconds // HOUR)
        return f"{hours} h" if hours % 24 else f"{hours // 24} d"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


__all__ = [
    "FIFO",
    "QUEUE_POLICIES",
    "QueuePolicy",
    "QueueRule",
    "Waiter",
    "ahead_of",
    "gib_hours",
    "line_up",
    "why_waiting",
]
