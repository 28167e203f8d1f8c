"""How long a queued start will wait: "about 6 min", or unknown. Pure.

The estimate plays the queue forward, ``SAMPLES`` times. In each play every slice held now ends
after a remaining time drawn from how much longer slices of about its size were held, among the
holds that lasted at least as long as it has been held so far (a slice already older than all
of them is as likely to end within as long again as not). As slices end, the requests in line
are placed in order by the allocator itself (:func:`jupyter_gpushare.core.placement.allocator.fit`,
head-of-line as the queue is), each then holding its slice for a duration drawn from the past
holds; a play ends when the start in question is placed. The estimate is the median of the
plays: the first of thirty slices to end comes much sooner than any one slice's median end, which
a single play with medians would miss.

The draws are stratified (play *k* of *n* draws each slice's quantile ``(k + ½) / n``, rotated
by a fixed offset per slice), so the estimate is a function of its inputs: the same queue gets
the same answer. With fewer than ``MIN_HISTORY`` finished holds there is nothing to go by:
unknown (None).

The model holds where past holds say how long the slices held now will last. Where they do not
(a cluster's pods that run for weeks, of which only the short ones have finished; a change of
habits), the naive estimate — the place in line × the median hold / the cards — can be nearer.
So before it plays the queue the estimate checks itself against the naive one on the past, from
the finished holds alone (when each ended is known): at the start of each of the last
``CHECKED`` holds it asks both when the *k*-th of the slices held then ended (*k*: the place in
line of the start asked about), each from the holds finished by that moment, and compares with
when it did end (known when at least *k* of them have ended since). Where its median error is
larger than the naive one's, it answers the naive estimate.

That check judges the model by when slices ended, which is not quite a wait: where many small
slices share a card, the model tells well when the *k*-th of them ends, and still errs on when
a start is placed (which depends on which of them end where it fits). So once enough starts have
been placed since their estimates were kept (:class:`Judged`: both estimates of each start, made
while it waited, against when it was placed; ``JUDGED_MIN``), the model is judged on those
instead, and answers only where its median error was at most the naive one's both over all of
them (the last ``JUDGED``) and over the last ``JUDGED_RECENT``: the naive estimate otherwise.
Both records, not either: where the two are about as good (a pool of many small slices), a
choice that follows one record swaps to the model wherever it looked better for a while, and
those swaps cost more than they give (on Alibaba's ``gpushare100`` pod list, either record alone
errs more than the naive estimate; both together, less: docs/benchmarks.md). The caller keeps
the estimates (:func:`estimates` gives both).
"""

from __future__ import annotations

import bisect
import heapq
import statistics
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.placement.allocator import Held, Policy, Request, Spot, fit

MIN_HISTORY = 5  # finished holds needed before anything is estimated
SIMILAR = 2.0  # a hold "of about its size": memory within this factor
SAMPLES = 31  # plays of the queue (odd: the median is one of them)
MAX_STEPS = 500  # slices ended or placed in one play before it gives up (unknown)
CHECKED = 20  # past starts the model is checked on against the naive estimate
CHECK_SAMPLES = 11  # plays of each past moment in that check
JUDGED = 1000  # placed starts whose kept estimates judge the model against the naive estimate
JUDGED_RECENT = 100  # of them, the recent ones that must favour the model too
JUDGED_MIN = 10  # placed starts judged before they decide (until then: the check on past holds)
# Seconds within which two times are one moment in the check on past holds: the GPU broker
# records what one look saw at one time, but a hold's start worked out as its end less its
# length differs from it by a fraction of a millisecond (57 µs seen: the look's clock and the
# database's), so a hold that ended as another began would count as held then, ending at once:
# a wait of 0 s that both estimates miss alike, which made the check a coin toss.
SAME_MOMENT = 0.01


@dataclass(frozen=True)
class Judged:
    """A placed start's two estimates, kept from while it waited, against when it was placed
    (seconds since the epoch each)."""

    model: float
    naive: float
    placed_at: float

    @property
    def errors(self) -> tuple[float, float]:
        """How far off the model and the naive estimate were."""
        return abs(self.model - self.placed_at), abs(self.naive - self.placed_at)


@dataclass(frozen=True)
class Estimates:
    """What the model (the plays) and the naive estimate say, and which of them is answered."""

    model: float | None
    naive: float | None
    answer: float | None


@dataclass(frozen=True)
class History:
    """Finished holds: ``(bytes, seconds)`` each; ``ended_at``: when each ended (seconds since the
    epoch, in the same order), empty where not known (the model is then not checked)."""

    holds: tuple[tuple[int, float], ...]
    ended_at: tuple[float, ...] = ()
    judged: tuple[Judged, ...] = ()  # placed starts' kept estimates, oldest first
    # Sorted durations by memory, worked out once per size asked about (plays ask thousands).
    _sorted: dict[int, list[float]] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def judged_for_model(self) -> bool | None:
        """Whether the placed starts judged favour the model (the module's text); None where
        fewer than ``JUDGED_MIN`` were."""
        if len(self.judged) < JUDGED_MIN:
            return None
        return _nearer(self.judged[-JUDGED:]) and _nearer(self.judged[-JUDGED_RECENT:])

    @cached_property
    def _by_memory(self) -> tuple[list[int], list[float]]:
        ordered = sorted(self.holds)
        return [memory for memory, _ in ordered], [seconds for _, seconds in ordered]

    def durations(self, memory: int) -> list[float]:
        """Sorted durations of holds of about ``memory`` bytes (all of them when few are)."""
        known = self._sorted.get(memory)
        if known is None:
            memories, seconds = self._by_memory
            low = bisect.bisect_left(memories, memory / SIMILAR)
            high = bisect.bisect_right(memories, memory * SIMILAR)
            similar = seconds[low:high] if memory > 0 else []
            known = sorted(similar if len(similar) >= MIN_HISTORY else seconds)
            self._sorted[memory] = known
        return known

    def remaining(self, memory: int, age: float, quantile: float = 0.5) -> float:
        """How much longer a slice of ``memory`` bytes held for ``age`` seconds lasts, at
        ``quantile`` of the holds of its size that lasted longer than that."""
        durations = self.durations(memory)
        first = bisect.bisect_right(durations, age)
        longer = len(durations) - first
        if not longer:
            # Older than every hold: as likely to end within as long again as not.
            return max(age, 1.0) * quantile / (1.0 - quantile)
        return durations[first + min(longer - 1, int(quantile * longer))] - age

    def median(self) -> float:
        return statistics.median(seconds for _, seconds in self.holds)


def _nearer(judged: Sequence[Judged]) -> bool:
    """Whether the model's median error over ``judged`` is at most the naive estimate's."""
    errors = [one.errors for one in judged]
    return statistics.median(model for model, _ in errors) <= statistics.median(naive for _, naive in errors)


def _offset(key: str) -> float:
    return zlib.crc32(key.encode()) / 2**32


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
    naive = naive_start(now, len(ahead), devices, history)
    if naive is not None and not trusts_model(now, len(ahead) + 1, devices, held, held_since, history):
        return naive
    return model_start(now, me, ahead, devices, held, held_since, history, policy)


def estimates(
    now: float,
    me: Request,
    ahead: Sequence[Request],
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    history: History,
    policy: Policy,
) -> Estimates:
    """Both estimates of :func:`expected_start`, and its answer: what a caller keeps of a
    waiting start, to judge them when it is placed (:class:`Judged`). Costs the plays even
    where the answer is the naive estimate."""
    if len(history.holds) < MIN_HISTORY:
        return Estimates(None, None, None)
    naive = naive_start(now, len(ahead), devices, history)
    model = model_start(now, me, ahead, devices, held, held_since, history, policy)
    if naive is not None and not trusts_model(now, len(ahead) + 1, devices, held, held_since, history):
        return Estimates(model, naive, naive)
    return Estimates(model, naive, model)


def model_start(
    now: float,
    me: Request,
    ahead: Sequence[Request],
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    history: History,
    policy: Policy,
) -> float | None:
    """The model's estimate alone: the median of the plays of the queue (the module's text)."""
    if len(history.holds) < MIN_HISTORY:
        return None
    plays = []
    for play in range(SAMPLES):
        base = (play + 0.5) / SAMPLES

        def draw(key: str, memory: int, age: float, base: float = base) -> float:
            return history.remaining(memory, age, (base + _offset(key)) % 1.0)

        plays.append(_play(now, me, ahead, devices, held, held_since, draw, policy))
    # The median, a play that never places it counting as later than every other.
    finite = sorted(start for start in plays if start is not None)
    return finite[SAMPLES // 2] if len(finite) > SAMPLES // 2 else None


def naive_start(now: float, position: int, devices: Sequence[Device], history: History) -> float | None:
    """The naive estimate for the start ``position`` places from the head of the line (0: first):
    its place in line × the median hold / the cards; None with too little history."""
    if len(history.holds) < MIN_HISTORY or not devices:
        return None
    return now + (position + 1) * history.median() / len(devices)


def trusts_model(
    now: float,
    ends: int,
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    history: History,
) -> bool:
    """Whether to answer the model's estimate rather than the naive one: as the placed starts
    judged say (:attr:`History.judged_for_model`), or :func:`model_holds` before there are
    enough of them."""
    judged = history.judged_for_model
    return model_holds(now, ends, devices, held, held_since, history) if judged is None else judged


def model_holds(
    now: float,
    ends: int,
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    history: History,
) -> bool:
    """Whether the model has told when the ``ends``-th of the slices held at a past start would
    end at least as well as the naive estimate (the module's text); True where it cannot be
    checked (no end times, or no past start whose ``ends``-th end is known yet)."""
    if not history.ended_at:
        return True
    by_end = sorted(zip(history.ended_at, history.holds, strict=True))
    ends_at = [end for end, _ in by_end]
    spans = sorted((end - seconds, end, memory) for end, (memory, seconds) in by_end)
    model_errors: list[float] = []
    naive_errors: list[float] = []
    for moment, _, _ in spans[-CHECKED:]:
        # What the estimate knew then: the holds that had ended by that moment.
        past = History(
            tuple(hold for _, hold in by_end[: bisect.bisect_right(ends_at, moment + SAME_MOMENT)])
        )
        if len(past.holds) < MIN_HISTORY:
            continue
        then = [
            (memory, moment - start, end)
            for start, end, memory in spans
            if start < moment - SAME_MOMENT and moment + SAME_MOMENT < end
        ]
        if len(then) < ends:
            continue
        real = sorted(end for _, _, end in then)[ends - 1] - moment
        still = [
            (slice_.memory, moment - held_since[slice_.kernel_id])
            for slice_ in held
            if held_since.get(slice_.kernel_id, now) < moment
        ]
        ages = [(memory, age) for memory, age, _ in then] + still
        plays = sorted(
            sorted(
                past.remaining(memory, age, ((play + 0.5) / CHECK_SAMPLES + number / len(ages)) % 1.0)
                for number, (memory, age) in enumerate(ages)
            )[ends - 1]
            for play in range(CHECK_SAMPLES)
        )
        model_errors.append(abs(plays[CHECK_SAMPLES // 2] - real))
        naive_errors.append(abs(ends * past.median() / len(devices) - real))
    if not model_errors:
        return True
    return statistics.median(model_errors) <= statistics.median(naive_errors)


def _play(
    now: float,
    me: Request,
    ahead: Sequence[Request],
    devices: Sequence[Device],
    held: Sequence[Held],
    held_since: Mapping[str, float],
    draw: Callable[[str, int, float], float],
    policy: Policy,
) -> float | None:
    """One play of the queue: when ``me`` is placed, or None."""
    ends: list[tuple[float, int, Held]] = []
    for order, slice_ in enumerate(held):
        age = max(0.0, now - held_since.get(slice_.kernel_id, now))
        ends.append((now + draw(slice_.kernel_id, slice_.memory, age), order, slice_))
    heapq.heapify(ends)
    current = list(held)
    taken = {device.uuid: 0 for device in devices}
    for slice_ in held:
        taken[slice_.device_uuid] = taken.get(slice_.device_uuid, 0) + slice_.memory
    line = [*ahead, me]
    clock = now
    counter = len(ends)
    for _ in range(MAX_STEPS):
        while line:
            if not _may_fit(line[0], devices, taken, policy):
                break  # not enough memory free anywhere: the allocator would refuse it too
            outcome = fit(line[0], devices, current, policy)
            if not isinstance(outcome, Spot):
                if outcome.retry:
                    break
                if line[0] is me:
                    return None  # it can never be placed
                line.pop(0)  # a request that can never be placed leaves the line
                continue
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
            taken[new.device_uuid] += new.memory
            counter += 1
            heapq.heappush(ends, (clock + draw(placed.kernel_id, new.memory, 0.0), counter, new))
        if not ends:
            return None
        clock, _, ended = heapq.heappop(ends)
        clock = max(clock, now)
        current.remove(ended)
        taken[ended.device_uuid] -= ended.memory
    return None


def _may_fit(request: Request, devices: Sequence[Device], taken: Mapping[str, int], policy: Policy) -> bool:
    """Whether some device has the memory ``request`` needs free (a quick necessary condition
    of :func:`fit`, which decides; MIG instances and whole cards are left to it)."""
    if request.placement == "mig" or request.size.is_whole or request.placement == "exclusive":
        return True
    return any(
        device.memory_total * policy.overcommit - taken.get(device.uuid, 0)
        >= request.size.resolve(device.memory_total)
        for device in devices
        if not device.mig_enabled
    )


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


__all__ = [
    "JUDGED",
    "JUDGED_MIN",
    "JUDGED_RECENT",
    "MIN_HISTORY",
    "SAMPLES",
    "Estimates",
    "History",
    "Judged",
    "describe",
    "estimates",
    "expected_start",
    "model_holds",
    "model_start",
    "naive_start",
    "trusts_model",
]
