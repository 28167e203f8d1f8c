"""Replay: a week of notebook sessions and their cells through the package's allocator, queue and
idle policy, on a pool you name — what idle notebooks cost, and how much suspending gives back.

Method
------
**Trace.** ``replay_trace.generate``: a seeded week of ~60 people's notebooks (heavy-tailed
sessions, some left on for days; cells running about a third of the working time; ``--shape``
for heavier tails, bursts of starts or few users). Or a trace
file (``--trace``: the ``gpushare-trace/1`` JSON format, or an ``openb_pod_list`` CSV of a
cluster's pods, which have no cells). See ``replay_trace.py`` for the format.

**Idle policy** (``GPUShare.idle_release_after`` with ``idle_action = "suspend"``): a kernel idle
for ``--suspend-after`` seconds (no cell running; counted from its start, then from each cell's
end) gives its slice back; its next cell asks for one again (a *resume*) and waits in the same
queue as a start. Each session becomes a list of holds — the slice asked for, held, given back;
everything in a hold shifts by the time its request waited. Off: a session holds its slice from
its start to its end.

**Simulation.** Discrete events in virtual time. Requests (starts and resumes) queue in the order of
:func:`jupyter_gpushare.core.placement.queue_order.line_up` — ``fifo`` or ``fair`` (users' decayed
reserved GiB·hours from :func:`jupyter_gpushare.core.accounting.tally.recent_use`, half life a day,
age bound 120 s, the package's defaults) — and only the first in line may be placed, by
:func:`jupyter_gpushare.core.placement.allocator.fit` on N cards (head-of-line, as the node ledger
does). A quick sum of free memory skips a ``fit`` that cannot succeed. Whole-card reservation is the
same queue with ``kind = "exclusive"`` (the native device plugin) and no suspension. Every hold is
also folded through :func:`jupyter_gpushare.core.accounting.tally.fold` (the accounting's own
arithmetic); its reserved figure must equal the simulation's.

**Figures.** For each way, the smallest N whose p95 wait (starts and resumes together, nearest
rank: at most 5% of the requests wait longer) is at most 60 s, and at that N: waits, GPU-hours
reserved (memory-weighted: a 20G slice for an hour on an 80G card is a quarter GPU-hour), the busy
GPU-hours inside them (memory x time while cells run), resumes and their waits. Every way is
searched the same way, from one card up (galloping, then bisection): under a goal that lets 5%
wait, one card is the only lower bound that holds for all of them (the most memory held at once
is none), so slices cannot come out needing more cards than whole cards because of where the
search began. The **bound** is a way too, searched the same way under the same goal: memory held
only while cells run (each cell asks for its slice and gives it back when it ends; a trace
without cells holds throughout), so its GPU-hours are the busy ones. The **wait estimate**
(:func:`jupyter_gpushare.core.placement.wait_estimate.estimates`, from the slices held, the
holds finished so far and the placed starts' kept estimates, as the node ledger keeps them) is
asked for every request that waits, at that moment, on the most cards below those needed where
at least 50 requests wait; its median absolute error against the real wait is reported next to
the naive estimate's (:func:`~jupyter_gpushare.core.placement.wait_estimate.naive_start`: the
place in line x the median hold / the cards), with the share of estimates that were the naive
one (the model had erred more on the starts placed before, or, before there were ten, on the
past holds) and those it could not tell (fewer than five finished holds).

Run: ``.venv/bin/python benchmarks/replay.py [--plot docs/replay.png]`` (a generated week, under
two minutes on 2 cores); ``--quick`` (two days, 30 users) in under a minute.
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replay_trace import SHAPES, Session, Trace, busy_share, generate, load

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.core.accounting.tally import Event, Figures, KernelAccount, add_spans, fold, recent_use
from jupyter_gpushare.core.placement.allocator import Held, Policy, Request, Spot, fit
from jupyter_gpushare.core.placement.queue_order import QueuePolicy, QueueRule, Waiter, line_up
from jupyter_gpushare.core.placement.wait_estimate import JUDGED, History, Judged, estimates
from jupyter_gpushare.core.sizes import parse_size

GOAL_P95 = 60.0
GOAL_QUANTILE = 95  # the goal: this percentile of the waits within GOAL_P95
HOLDS_KEPT = 2000
MIN_ESTIMATES = 50  # estimated waits wanted on the pool where the wait estimate is measured


@dataclass(frozen=True)
class Way:
    name: str
    policy: QueuePolicy = "fifo"
    suspend_after: float | None = None
    whole_card: bool = False
    cells_only: bool = False  # the bound: memory held only while cells run


BOUND = Way("bound (memory only while cells run)", cells_only=True)


@dataclass(frozen=True)
class Hold:
    session: int
    index: int
    request: float  # when it is asked for (trace time)
    length: float  # seconds it is held once placed
    busy: float  # seconds of cells in it
    resume: bool


def plan(number: int, session: Session, suspend_after: float | None, cells_only: bool = False) -> list[Hold]:
    """The holds of a session under the idle policy (one, without suspension or cells);
    ``cells_only``: one hold per cell, the bound's (a session without cells holds throughout)."""
    if cells_only and session.cells:
        return [
            Hold(number, index, at, duration, duration, index > 0)
            for index, (at, duration) in enumerate(session.cells)
        ]
    cells = session.cells or ()
    if suspend_after is None or not cells:
        busy = session.busy() if cells else session.end - session.start
        return [Hold(number, 0, session.start, session.end - session.start, busy, False)]
    holds: list[Hold] = []
    start, busy, resume, idle_since = session.start, 0.0, False, session.start
    for at, duration in cells:
        if at - idle_since >= suspend_after:
            holds.append(Hold(number, len(holds), start, idle_since + suspend_after - start, busy, resume))
            start, busy, resume = at, 0.0, True
        busy += duration
        idle_since = max(idle_since, at + duration)
    end = idle_since + suspend_after if session.end - idle_since >= suspend_after else session.end
    holds.append(Hold(number, len(holds), start, end - start, busy, resume))
    return holds


@dataclass
class Result:
    cards: int
    waits: list[float] = field(default_factory=list)
    resume_waits: list[float] = field(default_factory=list)
    reserved: float = 0.0  # byte-seconds
    busy: float = 0.0  # byte-seconds of the requested memory while cells run
    never: int = 0  # requests no card could hold
    errors: list[float] = field(default_factory=list)  # |estimate - real| of waits, seconds
    naive: list[float] = field(default_factory=list)
    unknown: int = 0
    fell_back: int = 0  # estimates that were the naive one (the model was not trusted)
    events: list[Event] = field(default_factory=list)
    by_user: dict[str, list[float]] = field(default_factory=dict)  # each user's waits

    gave_up: bool = False  # stopped once too many had waited past the goal: fails it

    def p(self, q: float) -> float:
        """The ``q``th percentile of the waits, nearest rank (so that p95 <= the goal is exactly
        "at most 5% of the requests wait longer", which a replay can stop early on)."""
        every = sorted(self.waits + self.resume_waits)
        return every[max(0, math.ceil(q / 100 * len(every)) - 1)] if every else 0.0

    def meets(self) -> bool:
        return not self.gave_up and self.p(95) <= GOAL_P95


@dataclass
class _Waiting:
    waiter: Waiter
    request: Request
    hold: Hold
    estimated: bool = False  # the wait estimate was asked for
    expected: float | None = None
    model: float | None = None
    naive: float | None = None


def replay(
    trace: Trace,
    plans: Sequence[Sequence[Hold]],
    cards: int,
    card: str,
    way: Way,
    estimate: bool = False,
    give_up: bool = False,
) -> Result:
    """The trace on ``cards`` cards. ``give_up``: stop as soon as more than 5% of all the requests
    have waited longer than the goal (placed late, or still waiting past it): the goal is missed
    whatever follows, and on too few cards the queue would grow to the whole trace."""
    devices = parse_simulation(f"{cards}x{card}").devices
    rule = QueueRule(way.policy)  # the package's defaults: half life a day, age bound 120 s
    policy = Policy(queue=rule)
    kind = "exclusive" if way.whole_card else "shared"
    sizes = [parse_size("whole" if way.whole_card else s.memory) for s in trace.sessions]
    asked = [size.resolve(devices[0].memory_total) for size in sizes]
    result = Result(cards)
    heap: list[tuple[float, int, int, int, bool]] = []  # (time, order, session, hold, is release)
    counter = 0
    for number, holds in enumerate(plans):
        heap.append((holds[0].request, counter, number, 0, False))
        counter += 1
    heapq.heapify(heap)
    waiting: list[_Waiting] = []  # in the order they arrived
    arrivals = 0
    allowed = math.floor((1 - GOAL_QUANTILE / 100) * sum(len(holds) for holds in plans))
    late = 0  # placed after waiting longer than the goal
    held: dict[str, Held] = {}
    since: dict[str, float] = {}
    on_card = {device.uuid: 0 for device in devices}
    stored: dict[str, tuple[float, float]] = {}
    running: dict[str, KernelAccount] = {}
    finished: list[tuple[int, float]] = []
    ended: list[float] = []  # when each of ``finished`` ended
    judged: list[Judged] = []  # placed starts' estimates, as the ledger keeps them
    total = devices[0].memory_total

    def might_fit(request: Request, memory: int) -> bool:
        if kind == "exclusive":
            return any(used == 0 for used in on_card.values())
        return any(total - used >= memory for used in on_card.values())

    def line(now: float) -> list[_Waiting]:
        """Everyone waiting, in the order they are served."""
        if not rule.fair or len({w.waiter.owner for w in waiting}) < 2:
            return waiting
        usage = recent_use(stored, running.values(), now, rule.half_life)
        order = line_up((w.waiter for w in waiting), usage, now, rule)
        by_id = {w.waiter.kernel_id: w for w in waiting}
        return [by_id[waiter.kernel_id] for waiter in order]

    def first(now: float) -> _Waiting:
        """The first in line: the order's first among each user's first (a user's requests are
        served in the order made, and the oldest of all is some user's first), so a long queue
        costs a sort of the users, not of every request."""
        if not rule.fair:
            return waiting[0]
        firsts: dict[str, _Waiting] = {}
        for entry in waiting:
            firsts.setdefault(entry.waiter.owner, entry)
        if len(firsts) < 2:
            return waiting[0]
        usage = recent_use(stored, running.values(), now, rule.half_life)
        head = line_up((w.waiter for w in firsts.values()), usage, now, rule)[0]
        return firsts[head.owner]

    def too_late(now: float) -> bool:
        """More than ``allowed`` requests wait longer than the goal (the line is in arrival order
        for the clock: count its oldest)."""
        waited = late
        for entry in waiting:
            if now - entry.waiter.requested_at <= GOAL_P95 or waited > allowed:
                break
            waited += 1
        return waited > allowed

    def drain(now: float) -> None:
        nonlocal counter, late
        while waiting:
            head = first(now)
            number = head.hold.session
            if not might_fit(head.request, asked[number]):
                return
            outcome = fit(head.request, devices, list(held.values()), policy)
            if not isinstance(outcome, Spot):
                if outcome.retry:
                    return
                waiting.remove(head)
                result.never += 1
                continue
            waiting.remove(head)
            key = head.waiter.kernel_id
            slice_ = Held(
                key,
                head.waiter.owner,
                outcome.device_uuid,
                outcome.unit_uuid,
                outcome.memory,
                outcome.whole_card,
            )
            held[key], since[key] = slice_, now
            on_card[outcome.device_uuid] += outcome.memory
            running[key] = KernelAccount(key, head.waiter.owner, "", "running", now, memory=outcome.memory)
            wait = now - head.waiter.requested_at
            late += wait > GOAL_P95
            (result.resume_waits if head.hold.resume else result.waits).append(wait)
            result.by_user.setdefault(head.waiter.owner, []).append(wait)
            if head.estimated:
                if head.expected is None:
                    result.unknown += 1
                else:
                    result.errors.append(abs(head.expected - now))
                    result.fell_back += head.expected == head.naive
                if head.naive is not None:
                    result.naive.append(abs(head.naive - now))
                if head.model is not None and head.naive is not None:
                    judged.append(Judged(head.model, head.naive, now))
            result.reserved += outcome.memory * head.hold.length
            result.busy += asked[number] * head.hold.busy
            owner, at = head.waiter.owner, head.waiter.requested_at
            result.events.append(Event(now, key, owner, "placed", outcome.memory, 0, requested_at=at))
            heapq.heappush(heap, (now + head.hold.length, counter, number, head.hold.index, True))
            counter += 1

    while heap:
        now, _, number, index, release = heapq.heappop(heap)
        hold = plans[number][index]
        key = f"{number}.{index}"
        if release:
            slice_ = held.pop(key)
            on_card[slice_.device_uuid] -= slice_.memory
            account = running.pop(key)
            value, at = stored.get(account.owner, (0.0, now))
            stored[account.owner] = add_spans(value, at, [(since[key], now, slice_.memory)], rule.half_life)
            finished.append((slice_.memory, now - since.pop(key)))
            ended.append(now)
            result.events.append(Event(now, key, account.owner, "ended", slice_.memory))
            if index + 1 < len(plans[number]):
                following = plans[number][index + 1]
                heapq.heappush(heap, (max(following.request, now), counter, number, index + 1, False))
                counter += 1
        else:
            session = trace.sessions[number]
            request = Request(key, session.user, sizes[number], kind)  # type: ignore[arg-type]
            arrivals += 1
            entry = _Waiting(Waiter(key, session.user, arrivals, now), request, hold)
            waiting.append(entry)
        drain(now)
        if give_up and too_late(now):
            result.gave_up = True
            return result
        if estimate and not release and entry in waiting:
            ahead = line(now)
            position = ahead.index(entry)
            history = History(
                tuple(finished[-HOLDS_KEPT:]), tuple(ended[-HOLDS_KEPT:]), tuple(judged[-JUDGED:])
            )
            entry.estimated = True
            both = estimates(
                now,
                entry.request,
                [w.request for w in ahead[:position]],
                devices,
                list(held.values()),
                since,
                history,
                policy,
            )
            entry.expected, entry.model, entry.naive = both.answer, both.model, both.naive
    return result


def needed(trace: Trace, plans: Sequence[Sequence[Hold]], card: str, way: Way) -> Result:
    """The run on the fewest cards whose p95 wait is within the goal, for every way the same
    search: galloping up from one card, the only lower bound that holds for every way under a
    goal that lets 5% of the requests wait (the most memory held at once is none: those 5% may
    wait through it), then bisection (p95 falls as N grows). Runs that miss the goal stop as soon
    as they have (``give_up``), so the runs on far too few cards cost little."""
    bad, good = 0, None
    n = 1
    while good is None:
        outcome = replay(trace, plans, n, card, way, give_up=True)
        if outcome.meets():
            good = outcome
        else:
            bad, n = n, n * 2
    while good.cards - bad > 1:
        middle = (good.cards + bad) // 2
        outcome = replay(trace, plans, middle, card, way, give_up=True)
        if outcome.meets():
            good = outcome
        else:
            bad = middle
    return good


def waiting_pool(
    trace: Trace, plans: Sequence[Sequence[Hold]], needed: Result, card: str, way: Way
) -> Result | None:
    """The run, with the wait estimate asked for each request that waits, on the most cards
    below those needed on which at least ``MIN_ESTIMATES`` requests wait (a card fewer, two
    fewer, four fewer...): the estimate matters where starts wait, and a handful of waits says
    nothing of it."""
    cards, step, result = needed.cards - 1, 1, None
    while cards >= 1:
        result = replay(trace, plans, cards, card, way, estimate=True)
        if len(result.errors) + result.unknown >= MIN_ESTIMATES:
            break
        cards, step = cards - step, step * 2
    return result


def mae(errors: Sequence[float]) -> float:
    """The median absolute error (the errors are absolute already); nan without any."""
    return statistics.median(errors) if errors else float("nan")


def hours(byte_seconds: float, card_memory: int) -> float:
    return byte_seconds / card_memory / 3600


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trace", type=Path, help="a gpushare-trace/1 JSON file or an openb_pod_list CSV")
    parser.add_argument("--card", default="A100-80GB", help="the pool's cards (a simulated GPU type)")
    parser.add_argument("--suspend-after", type=float, default=600.0, help="idle seconds before a suspension")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--users", type=int, help="people in the generated trace (the shape's: 60)")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="default", help="the generated trace's shape"
    )
    parser.add_argument("--quick", action="store_true", help="two days of 30 users (CI, < 1 min)")
    parser.add_argument("--save-trace", type=Path, help="write the generated trace here")
    parser.add_argument("--plot", type=Path, help="write a chart of the figures (PNG, needs matplotlib)")
    arguments = parser.parse_args(argv)
    began = time.monotonic()
    if arguments.trace:
        try:
            trace = load(arguments.trace)
        except (OSError, ValueError) as error:
            parser.error(str(error))
    else:
        shape = SHAPES[arguments.shape]
        days, users = (2, min(30, shape.users)) if arguments.quick else (arguments.days, arguments.users)
        trace = generate(arguments.seed, days=days, users=users, shape=shape)
    if arguments.save_trace:
        from replay_trace import dump

        dump(trace, arguments.save_trace)
    card_memory = parse_simulation(f"1x{arguments.card}").devices[0].memory_total
    cells = sum(len(s.cells or ()) for s in trace.sessions)
    print(f"Replay: {trace.name}: {len(trace.sessions):,} sessions, {cells:,} cells", end="")
    print(f" (cells run {busy_share(trace.sessions):.0%} of the working time)" if cells else "")
    if trace.skipped:
        print(f"  {trace.skipped} pods of several GPUs left out")
    print(f"Pool: N x {arguments.card}; goal: p95 wait (starts and resumes) <= {GOAL_P95:.0f} s")
    suspend = arguments.suspend_after if cells else None
    ways = [Way("whole card (device plugin)", whole_card=True)]
    for policy in ("fifo", "fair"):
        ways.append(Way(f"gpushare {policy}, no suspend", policy))
        if suspend is not None:
            ways.append(Way(f"gpushare {policy}, suspend {suspend / 60:g} min", policy, suspend))
    rows = []
    for way in [*ways, BOUND]:
        plans = [
            plan(number, session, way.suspend_after, way.cells_only)
            for number, session in enumerate(trace.sessions)
        ]
        final = needed(trace, plans, arguments.card, way)
        folded = fold({}, final.events).buckets.values()
        accounted = sum((figures.reserved for figures in folded), Figures().reserved)
        assert math.isclose(accounted, final.reserved, rel_tol=1e-6), (accounted, final.reserved)
        tight = (
            None
            if way.whole_card or way.cells_only
            else waiting_pool(trace, plans, final, arguments.card, way)
        )
        rows.append((way, final, tight))
    busy = rows[1][1].busy
    print()
    header = (
        f"{'way':37} {'GPUs':>4} {'p50 s':>5} {'p95 s':>5} {'GPU-h reserved':>14} {'x busy':>6} "
        f"{'resumes':>7} {'resume p95 s':>12}"
    )
    print(header)
    print("-" * len(header))
    for way, result, _ in rows:
        every = result.waits + result.resume_waits
        resumes = [] if way.cells_only else result.resume_waits
        resume_p95 = statistics.quantiles(resumes, n=100)[94] if len(resumes) > 1 else 0.0
        print(
            f"{way.name:37} {result.cards:>4} {statistics.median(every):>5.0f} {result.p(95):>5.0f} "
            f"{hours(result.reserved, card_memory):>14,.0f} {result.reserved / busy:>6.1f} "
            f"{len(resumes):>7,} {resume_p95:>12.0f}"
        )
    print()
    print(
        "Where starts wait (the most cards, below those needed, on which at least "
        f"{MIN_ESTIMATES} requests wait): the wait estimate against the naive one, and each user's waits"
    )
    header = (
        f"{'way':37} {'GPUs':>4} {'waits':>6} {'median wait s':>13} {'MAE s':>6} {'naive MAE s':>11} "
        f"{'naive used':>10} {'unknown':>7} {'users mean wait s: median':>25} {'worst':>6}"
    )
    print(header)
    print("-" * len(header))
    for way, _, tight in rows:
        if tight is None:
            continue
        waited = sorted(w for w in tight.waits + tight.resume_waits if w > 0)
        asked = len(tight.errors) + tight.unknown
        means = [statistics.mean(waits) for waits in tight.by_user.values()]
        print(
            f"{way.name:37} {tight.cards:>4} {asked:>6,} "
            f"{(statistics.median(waited) if waited else 0):>13.0f} "
            f"{(mae(tight.errors)):>6.0f} {(mae(tight.naive)):>11.0f} "
            f"{(tight.fell_back / asked if asked else 0):>10.0%} "
            f"{(tight.unknown / asked if asked else 0):>7.0%} "
            f"{statistics.median(means):>25.0f} {max(means):>6.0f}"
        )
    whole = rows[0][1]
    best_way, best, _ = min(rows[1:-1], key=lambda row: row[1].reserved)
    print()
    whole_h, best_h, bound_h = (hours(x, card_memory) for x in (whole.reserved, best.reserved, busy))
    print(
        f"GPU-hours reserved over {trace.length / 86400:.1f} days: whole card {whole_h:,.0f}, "
        f"{best_way.name} {best_h:,.0f} (saves {whole_h - best_h:,.0f}), bound {bound_h:,.0f} "
        f"(gpushare reserves {best.reserved / busy:.1f}x the bound, whole card {whole.reserved / busy:.1f}x)"
    )
    # The goals of what the tables print: memory slices never need more cards than whole cards,
    # and each way's wait estimate errs no more than the naive one where starts wait.
    most_slices = max(result.cards for way, result, _ in rows[1:-1])
    worse = [
        f"{way.name} ({mae(tight.errors):.0f} s vs {mae(tight.naive):.0f} s)"
        for way, _, tight in rows
        if tight is not None and tight.errors and tight.naive and mae(tight.errors) > mae(tight.naive)
    ]
    print(
        f"VERDICT slices need no more GPUs than whole cards ({most_slices} vs {whole.cards}): "
        f"{'met' if most_slices <= whole.cards else 'MISSED'}; the wait estimate's MAE <= the naive "
        f"one's: {'met' if not worse else 'MISSED for ' + ', '.join(worse)}"
    )
    elapsed = time.monotonic() - began
    if arguments.trace:  # the goal is the generated week's
        print(f"replayed in {elapsed:.0f} s")
    else:
        limit = 60 if arguments.quick else 120
        print(f"replayed in {elapsed:.0f} s (goal < {limit} s): {'met' if elapsed < limit else 'MISSED'}")
    if arguments.plot:
        from replay_plot import plot

        plot(rows, card_memory, trace.name, arguments.plot)
        print(f"chart: {arguments.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
