"""How long a queued start will wait: "about 6 min", or unknown. Pure.

The estimate plays the queue forward. Each slice held now ends after its expected remaining
time — the median of how much longer slices of about its size were held, among the holds that
lasted at least as long as it has been held so far (a slice already older than any of them is
expected to last as long again). As slices end, the requests in line are placed in order by the
allocator itself (:func:`jupyter_gpushare.allocator.fit`, head-of-line as the queue is), each
expected to hold its slice for the median hold; the estimate is the moment the start in question
is placed. With fewer than ``MIN_HISTORY`` finished holds there is nothing to go by: unknown.
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .allocator import Held, Placement, Policy, Request, fit
from .devices import Device

MIN_HISTORY = 5  # finished holds needed before anything is estimated
SIMILAR = 2.0  # a hold "of about its size": memory within this factor
MAX_STEPS = 2000  # slices ended or placed before the estimate gives up (unknown)


@dataclass(frozen=True)
class History:
    """Finished holds: ``(bytes, seconds)`` each."""

    holds: tuple[tuple[int, float], ...]

    def durations(self, memory: int) -> list[float]:
        """Sorted durations of holds of about ``memory`` bytes (all of them when few are)."""
        similar = [seconds for held, seconds in self.holds if _similar(held, memory)]
        return sorted(similar if len(similar) >= MIN_HISTORY else (s for _, s in self.holds))

    def remaining(self, memory: int, age: float) -> float:
        """How much longer a slice of ``memory`` bytes held for ``age`` seconds is expected to be."""
        durations = self.durations(memory)
        longer = durations[bisect.bisect_right(durations, age) :]
        return statistics.median(longer) - age if longer else max(age, 1.0)


def _similar(held: int, memory: int) -> bool:
    return memory > 0 and held > 0 and 1 / SIMILAR <= held / memory <= SIMILAR


def expected_start(
    now: float,
    me: Request,
    ahead: Sequence[Request],
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    history: History,
    policy: Policy,
) -> float | None:
    """When ``me`` is expected to be placed (seconds since the epoch), waiting behind ``ahead``
    (in the order they are served); None when there is no history, or ``me`` would never fit.

    ``held_since``: when each held slice was placed (kernel id → seconds since the epoch); one
    without a time (memory a released kernel's processes still hold) is as new.
    """
    if len(history.holds) < MIN_HISTORY:
        return None
    ends: list[tuple[float, int, Held]] = []
    for order, slice_ in enumerate(held):
        age = max(0.0, now - held_since.get(slice_.kernel_id, now))
        ends.append((now + history.remaining(slice_.memory, age), order, slice_))
    heapq.heapify(ends)
    current = list(held)
    line = [*ahead, me]
    clock = now
    counter = len(ends)
    for _ in range(MAX_STEPS):
        while line:
            outcome = fit(line[0], devices, current, policy)
            if not isinstance(outcome, Placement):
                if not outcome.retry:
                    if line[0] is me:
                        return None  # it can never be placed
                    line.pop(0)  # a request that can never be placed leaves the line
                    continue
                break
            placed = line.pop(0)
            if placed is me:
                return clock
            new = Held(
                placed.kernel_id,
                placed.owner,
                outcome.device_uuid,
                outcome.unit_uuid,
                outcome.memory,
                outcome.whole_card,
            )
            current.append(new)
            counter += 1
            heapq.heappush(ends, (clock + history.remaining(new.memory, 0.0), counter, new))
        if not ends:
            return None
        clock, _, ended = heapq.heappop(ends)
        clock = max(clock, now)
        current.remove(ended)
    return None


def describe(seconds: float | None) -> str:
    """``about 6 min``, ``about 2 h``, ``less than a minute``; ``unknown`` for None."""
    if seconds is None:
        return "unknown"
    if seconds < 60:
        return "less than a minute"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min"
    hours = seconds / 3600
    return f"about {hours:.0f} h" if hours >= 10 else f"about {hours:.1f} h".replace(".0 h", " h")


__all__ = ["MIN_HISTORY", "History", "describe", "expected_start"]
