"""Packing: how many 80 GiB GPUs a dev-test day needs under four ways of handing them out.

Method
------
**Trace.** A seeded generator writes one working day (08:00-19:00) of notebook kernels:

* ~60 users; each has a personal activity level (gamma, mean 1) and starts kernels as a
  non-homogeneous Poisson process (thinning) over a day profile - ramp-up 08-10, lunch dip
  12-13, tail-off 17-19 - averaging ``--kernels-per-user`` (5) kernels a day;
* memory requests from a fixed mix of 1-40 GiB weighted to small sizes, the sizes people pick
  from the presets (2G 4G 8G 16G) plus the odd custom size (mean ~7.8 GiB, see ``SIZE_MIX``);
* session lengths lognormal, median 30 min, sigma 1.1 (mean ~55 min), clipped to 2 min .. 10 h;
  a kernel runs for its session length from the moment it gets its GPU.

Only the Python ``random`` module draws numbers, so a seed gives the same day on any platform.

**Simulation.** A discrete-event simulation replays the day through the package's real
allocator, :func:`jupyter_gpushare.core.placement.allocator.fit` (``Request``/``Held``/``Policy`` and
``inventory.Device``/``MigInstance``). At every instant departures free their slices first,
arrivals join a strict FIFO queue, then the queue is drained from its head: the head is placed if
``fit`` finds room, and nobody behind it is tried while it waits - what ``Ledger.try_place`` does.
A refusal that waiting cannot change (``retry=False``) is a kernel that cannot run at all.
No queue timeout is applied (the package fails a request after ``queue_timeout``, 300 s by
default); waits above 300 s are counted instead.

**Policies**, on N simulated 80 GiB cards:

a. ``whole-card`` - native device plugin: ``placement='exclusive'`` (the request becomes ``whole``,
   as the package does for exclusive mode); one kernel per card.
b. ``timeslice-4`` - the device plugin's time-slicing with 4 replicas per card. A replica gives
   no memory isolation and a pod gets one replica however much it needs (asking for more
   replicas does not buy more memory), so each kernel takes one replica whatever its need. Each
   card is modelled as 4 devices of 20 GiB placed with ``placement='exclusive'``. Kernels needing more
   than 20 GiB still run, at risk of OOM: the output counts them and how often the summed needs
   on one card exceed its 80 GiB (an OOM on a real card).
c. ``mig-7x1g`` - static MIG, 7 x ``1g.10gb`` per card (``Device.mig``, ``placement='mig'``).
   Kernels needing more than 10 GiB cannot run at all: counted, left out of the wait statistics.
d. ``gpushare`` - best-fit memory slices, ``placement='shared'``, ``Policy(overcommit=1.0)``.

For each policy the smallest N whose p95 queue wait (all runnable kernels, zeros included) is
<= 60 s is found by a galloping then binary search over N (p95 wait falls as N grows).
At that N it reports: kernels per GPU (time-averaged running kernels / N), reserved-memory
utilisation (time-averaged memory the allocator holds / N x 80 GiB: a whole card, a 20 GiB
replica, a 10 GiB MIG instance or the slice) and requested-memory utilisation (the same with what
kernels asked for), all over the working day window. The physical bound is
ceil(peak concurrent requested memory / 80 GiB) with every kernel started on arrival.

Goal: gpushare needs no more GPUs than the bound (+0); whole-card about 5x as many.

When gpushare needs more than the bound, two counterfactual runs of the same allocator split the
excess: ``fluid`` (one device of N x 80 GiB, strict FIFO: no fragmentation across cards) and
``skip-ahead`` (N cards, but the queue is scanned past a blocked head: no head-of-line blocking).
Head-of-line and fragmentation figures for gpushare are printed either way. More seeds
(``--seeds``) show how often gpushare exceeds the bound.

Run: ``.venv/bin/python benchmarks/packing.py --plot docs/packing.png`` (well under a minute;
``--quick`` fewer seeds).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import os
import platform
import random
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jupyter_gpushare.backends.local.inventory import Device, MigInstance
from jupyter_gpushare.core.placement.allocator import Held, NoFit, Placement, Policy, Request, Spot, fit
from jupyter_gpushare.core.sizes import GiB, Size, parse_size

CARD = 80 * GiB
DAY_START_H, DAY_END_H = 8.0, 19.0
WINDOW = (0.0, (DAY_END_H - DAY_START_H) * 3600)
WAIT_GOAL_S = 60.0
QUEUE_TIMEOUT_S = 300.0

# (GiB, weight): presets most, custom sizes rarely; weighted to small.
SIZE_MIX: tuple[tuple[int, float], ...] = (
    (1, 10),
    (2, 20),
    (4, 25),
    (6, 3),
    (8, 17),
    (12, 7),
    (16, 10),
    (24, 5),
    (32, 2),
    (40, 1),
)
# Relative arrival intensity per hour of the day, 08:00 .. 19:00.
DAY_PROFILE: tuple[float, ...] = (0.35, 0.8, 1.0, 1.0, 0.5, 0.9, 1.0, 1.0, 0.9, 0.6, 0.25)
SESSION_MEDIAN_S = 30 * 60
SESSION_SIGMA = 1.1
SESSION_CLIP_S = (2 * 60, 10 * 3600)


# ---- trace ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    number: int
    user: str
    arrival: float  # seconds after 08:00
    duration: float  # seconds it runs once placed
    need: int  # bytes asked for


def generate_trace(seed: int, users: int = 60, kernels_per_user: float = 5.0) -> list[Kernel]:
    """One working day of kernels, sorted by arrival; the same seed gives the same day."""
    rng = random.Random(seed)
    hours = len(DAY_PROFILE)
    peak = max(DAY_PROFILE)
    mean_profile = sum(DAY_PROFILE) / hours
    sizes = [size for size, _ in SIZE_MIX]
    cumulative = []
    total = 0.0
    for _, weight in SIZE_MIX:
        total += weight
        cumulative.append(total)
    drawn: list[tuple[float, str, float, int]] = []
    for user_number in range(users):
        user = f"user{user_number:02d}"
        activity = rng.gammavariate(2.0, 0.5)  # mean 1: some people use notebooks far more
        # Peak hourly rate so that the day averages kernels_per_user * activity kernels.
        rate_peak = kernels_per_user * activity / (hours * mean_profile) * peak / 3600
        t = 0.0
        while True:
            t += rng.expovariate(rate_peak) if rate_peak > 0 else math.inf
            if t >= hours * 3600:
                break
            if rng.random() * peak > DAY_PROFILE[int(t // 3600)]:
                continue  # thinning: the day profile
            need = sizes[bisect.bisect_right(cumulative, rng.random() * total)] * GiB
            duration = SESSION_MEDIAN_S * math.exp(rng.gauss(0.0, SESSION_SIGMA))
            duration = min(max(duration, SESSION_CLIP_S[0]), SESSION_CLIP_S[1])
            drawn.append((t, user, duration, need))
    drawn.sort()
    return [Kernel(i, user, t, d, need) for i, (t, user, d, need) in enumerate(drawn)]


def peak_demand(trace: Sequence[Kernel]) -> tuple[int, int]:
    """(peak concurrent requested bytes, peak concurrent kernels) if everyone starts on arrival."""
    events = sorted(
        [(k.arrival, 1, k.need) for k in trace] + [(k.arrival + k.duration, 0, -k.need) for k in trace]
    )
    memory = running = peak_memory = peak_running = 0
    for _, starting, delta in events:  # ends (0) sort before starts (1) at the same instant
        memory += delta
        running += 1 if starting else -1
        peak_memory = max(peak_memory, memory)
        peak_running = max(peak_running, running)
    return peak_memory, peak_running


# ---- policies -------------------------------------------------------------------------------

WHOLE = parse_size("whole")


@dataclass(frozen=True)
class PolicySpec:
    key: str
    label: str
    placement: Placement
    devices: Callable[[int], list[Device]]
    size: Callable[[Kernel], Size]
    card_of: Callable[[Device], int] = lambda device: device.index


def _cards(n: int) -> list[Device]:
    return [Device(i, f"GPU-sim-{i}", "Simulated A100-80GB", CARD) for i in range(n)]


def _replicas(n: int) -> list[Device]:
    return [
        Device(4 * card + replica, f"GPU-sim-{card}-r{replica}", "time-sliced replica", CARD // 4)
        for card in range(n)
        for replica in range(4)
    ]


def _mig_cards(n: int) -> list[Device]:
    return [
        Device(
            card,
            f"GPU-sim-{card}",
            "Simulated A100-80GB (MIG 7x1g.10gb)",
            CARD,
            mig=tuple(MigInstance(f"MIG-sim-{card}-{i}", "1g.10gb", 10 * GiB) for i in range(7)),
        )
        for card in range(n)
    ]


def _bytes(kernel: Kernel) -> Size:
    return parse_size(f"{kernel.need // (1024 * 1024)}M")


POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec("whole-card", "(a) whole card", "exclusive", _cards, lambda k: WHOLE),
    PolicySpec(
        "timeslice-4", "(b) time-slicing x4", "exclusive", _replicas, lambda k: WHOLE, lambda d: d.index // 4
    ),
    PolicySpec("mig-7x1g", "(c) MIG 7x1g.10gb", "mig", _mig_cards, _bytes),
    PolicySpec("gpushare", "(d) gpushare best-fit", "shared", _cards, _bytes),
)


def _fluid_devices(n: int) -> list[Device]:
    return [Device(0, "GPU-sim-fluid", "all cards as one", n * CARD)]


FLUID = PolicySpec("fluid", "gpushare, one N x 80 GiB device", "shared", _fluid_devices, _bytes)


# ---- simulation -----------------------------------------------------------------------------


@dataclass
class Outcome:
    policy: str
    gpus: int
    runnable: int
    rejected: int
    waits: list[float]
    p95: float
    mean_wait: float
    over_timeout: int
    kernels_per_gpu: float
    reserved_util: float
    requested_util: float
    # gpushare diagnostics
    hol_kernels: int = 0  # fitted on arrival but waited behind an earlier request
    blocked_s: float = 0.0  # time the queue head was blocked
    fragmented_s: float = 0.0  # ...while the free memory summed over cards was enough for it
    # time-slicing diagnostics
    over_replica: int = 0  # kernels needing more than their 20 GiB replica
    oom_starts: int = 0  # starts after which a card's summed needs exceed 80 GiB
    oom_card_time: float = 0.0  # share of card-time with summed needs above 80 GiB
    overbooked: int = 0  # placements after which a device/instance holds more than its memory
    extra: dict[str, float] = field(default_factory=dict)


def _p95(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def simulate(trace: Sequence[Kernel], spec: PolicySpec, gpus: int, skip_ahead: bool = False) -> Outcome:
    devices = spec.devices(gpus)
    cards = {device.uuid: spec.card_of(device) for device in devices}
    policy = Policy(overcommit=1.0)
    requests = {k.number: Request(str(k.number), k.user, spec.size(k), spec.placement) for k in trace}
    held: dict[int, Held] = {}
    need_on_card: dict[int, int] = {}
    departures: list[tuple[float, int]] = []
    queue: deque[Kernel] = deque()
    waits: list[float] = []
    rejected = hol = oom_starts = overbooked = 0
    unit_memory = {d.uuid: d.memory_total for d in devices}
    unit_memory.update({m.uuid: m.memory_total for d in devices for m in d.mig})
    start_time: dict[int, float] = {}
    # time integrals over the working-day window
    area_running = area_reserved = area_requested = 0.0
    blocked = fragmented = oom_time = 0.0
    running_need = 0
    head_state = (False, False)  # (head blocked, enough free memory summed over cards)
    now = 0.0
    arrivals = list(trace)
    next_arrival = 0

    def fits_now(kernel: Kernel) -> bool:
        return isinstance(fit(requests[kernel.number], devices, held.values(), policy), Spot)

    def advance(to: float) -> None:
        nonlocal area_running, area_reserved, area_requested, blocked, fragmented, oom_time, now
        lo, hi = max(now, WINDOW[0]), min(to, WINDOW[1])
        if hi > lo:
            span = hi - lo
            area_running += span * len(held)
            area_reserved += span * sum(h.memory for h in held.values())
            area_requested += span * running_need
            if head_state[0]:
                blocked += span
                if head_state[1]:
                    fragmented += span
            oom_time += span * sum(1 for need in need_on_card.values() if need > CARD)
        now = to

    def place(kernel: Kernel, outcome: Spot) -> None:
        nonlocal running_need, oom_starts, overbooked
        held[kernel.number] = Held(
            str(kernel.number),
            kernel.user,
            outcome.device_uuid,
            outcome.unit_uuid,
            outcome.memory,
            outcome.whole_card,
        )
        on_unit = [h for h in held.values() if h.unit_uuid == outcome.unit_uuid]
        if sum(h.memory for h in on_unit) > unit_memory[outcome.unit_uuid] or (
            len(on_unit) > 1 and any(h.whole_card for h in on_unit)
        ):
            overbooked += 1
        card = cards[outcome.device_uuid]
        need_on_card[card] = need_on_card.get(card, 0) + kernel.need
        if need_on_card[card] > CARD:
            oom_starts += 1
        running_need += kernel.need
        start_time[kernel.number] = now
        waits.append(now - kernel.arrival)
        heapq.heappush(departures, (now + kernel.duration, kernel.number))

    def drain() -> None:
        nonlocal rejected, head_state
        index = 0
        while index < len(queue):
            kernel = queue[index]
            outcome = fit(requests[kernel.number], devices, held.values(), policy)
            if isinstance(outcome, Spot):
                del queue[index]
                place(kernel, outcome)
                continue
            assert isinstance(outcome, NoFit)
            if not outcome.retry:  # can never run under this policy (e.g. > 10 GiB on MIG)
                del queue[index]
                rejected += 1
                continue
            if not skip_ahead:
                break
            index += 1
        if queue:
            head = queue[0]
            free = sum(
                max(
                    0,
                    device.memory_total
                    - sum(h.memory for h in held.values() if h.device_uuid == device.uuid),
                )
                for device in devices
            )
            head_state = (True, free >= head.need)
        else:
            head_state = (False, False)

    while next_arrival < len(arrivals) or departures:
        t_arrival = arrivals[next_arrival].arrival if next_arrival < len(arrivals) else math.inf
        t_departure = departures[0][0] if departures else math.inf
        if t_departure <= t_arrival:
            advance(t_departure)
            _, number = heapq.heappop(departures)
            gone = held.pop(number)
            card = cards[gone.device_uuid]
            need_on_card[card] -= trace[number].need
            running_need -= trace[number].need
        else:
            advance(t_arrival)
            kernel = arrivals[next_arrival]
            next_arrival += 1
            if queue and not skip_ahead and fits_now(kernel):
                hol += 1  # would start now but for the earlier request at the head
            queue.append(kernel)
        drain()
    assert not queue, "requests left in the queue at the end of the day"

    span = WINDOW[1] - WINDOW[0]
    capacity = gpus * CARD
    runnable = len(trace) - rejected
    over_replica = sum(1 for k in trace if k.need > CARD // 4) if spec.key == "timeslice-4" else 0
    return Outcome(
        policy=spec.key,
        gpus=gpus,
        runnable=runnable,
        rejected=rejected,
        waits=waits,
        p95=_p95(waits),
        mean_wait=sum(waits) / len(waits) if waits else 0.0,
        over_timeout=sum(1 for w in waits if w > QUEUE_TIMEOUT_S),
        kernels_per_gpu=area_running / span / gpus,
        reserved_util=area_reserved / span / capacity,
        requested_util=area_requested / span / capacity,
        hol_kernels=hol,
        blocked_s=blocked,
        fragmented_s=fragmented,
        over_replica=over_replica,
        oom_starts=oom_starts,
        oom_card_time=oom_time / (span * gpus),
        overbooked=overbooked,
    )


def smallest_gpus(
    trace: Sequence[Kernel], spec: PolicySpec, skip_ahead: bool = False, start: int = 1
) -> tuple[int, Outcome, dict[int, Outcome]]:
    """Smallest N with p95 wait <= 60 s (galloping, then binary search); all runs by N."""
    runs: dict[int, Outcome] = {}

    def ok(n: int) -> bool:
        if n not in runs:
            runs[n] = simulate(trace, spec, n, skip_ahead)
        return runs[n].p95 <= WAIT_GOAL_S

    lo, hi = 0, max(1, start)  # lo fails (0 GPUs always fails), hi is probed
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 4096:
            raise RuntimeError(f"{spec.key}: no GPU count up to 4096 meets the wait goal")
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if ok(middle):
            hi = middle
        else:
            lo = middle
    return hi, runs[hi], runs


# ---- report ---------------------------------------------------------------------------------


def _plot(path: str, rows: list[tuple[PolicySpec, Outcome]], bound: int, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["(a) whole\ncard", "(b) time-\nslicing x4", "(c) MIG\n7x1g.10gb", "(d) gpushare\nbest-fit"]
    gpus = [outcome.gpus for _, outcome in rows]
    colors = ["#9e9e9e", "#f0a040", "#6a8fd0", "#3a9a5b"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), dpi=110)
    bars = left.bar(labels, gpus, color=colors)
    left.axhline(bound, color="#c0392b", linestyle="--", linewidth=1.5, label=f"physical bound = {bound}")
    notes = {
        "timeslice-4": lambda o: f"{o.over_replica} kernels > 20 GiB\n(OOM risk)",
        "mig-7x1g": lambda o: f"{o.rejected} kernels\ncannot run",
    }
    for bar, (spec, outcome) in zip(bars, rows, strict=True):
        text = str(outcome.gpus)
        if spec.key in notes:
            text += "\n" + notes[spec.key](outcome)
        left.annotate(
            text, (bar.get_x() + bar.get_width() / 2, outcome.gpus), ha="center", va="bottom", fontsize=8
        )
    left.set_ylabel("80 GiB GPUs needed (p95 wait <= 60 s)")
    left.set_title("GPUs needed for one dev-test day")
    left.legend(loc="upper right")
    left.set_ylim(0, max(gpus) * 1.2)

    x = range(len(rows))
    width = 0.38
    requested = [100 * outcome.requested_util for _, outcome in rows]
    reserved = [100 * outcome.reserved_util for _, outcome in rows]
    right.bar([i - width / 2 for i in x], reserved, width, label="reserved", color="#b0c4de")
    right.bar([i + width / 2 for i in x], requested, width, label="requested by kernels", color="#2e6da4")
    for i, (_, outcome) in enumerate(rows):
        right.annotate(
            f"{outcome.kernels_per_gpu:.1f}\nkernels/GPU",
            (i, max(reserved[i], requested[i])),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.set_xticks(list(x), labels)
    right.set_ylabel("time-averaged % of GPU memory, 08-19 h")
    right.set_ylim(0, 118)
    right.set_title("Memory utilisation at that GPU count")
    right.legend(loc="upper left", fontsize=8)
    figure.suptitle(f"jupyter-gpushare packing benchmark (seed {seed}, real allocator.fit)", fontsize=10)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, metadata={"Software": None})
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the headline day")
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--kernels-per-user", type=float, default=5.0, help="mean kernels per user per day")
    parser.add_argument("--seeds", type=int, default=10, help="extra days for the gpushare-vs-bound check")
    parser.add_argument("--quick", action="store_true", help="3 extra days instead of 10 (CI)")
    parser.add_argument("--plot", metavar="PATH", help="write the comparison chart (PNG) here")
    args = parser.parse_args(argv)
    extra_days = 3 if args.quick else args.seeds

    trace = generate_trace(args.seed, args.users, args.kernels_per_user)
    peak_memory, peak_running = peak_demand(trace)
    bound = math.ceil(peak_memory / CARD)
    needs = [k.need / GiB for k in trace]
    durations = sorted(k.duration / 60 for k in trace)
    print("Packing: GPUs needed for a synthetic dev-test day, replayed through allocator.fit")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"trace (seed {args.seed}): {len(trace)} kernels from {len({k.user for k in trace})} users, "
        f"08:00-19:00; request mean {sum(needs) / len(needs):.1f} GiB (1-40 GiB), "
        f"session median {durations[len(durations) // 2]:.0f} min, mean "
        f"{sum(durations) / len(durations):.0f} min"
    )
    print(
        f"peak concurrent demand (everyone starts on arrival): {peak_running} kernels, "
        f"{peak_memory / GiB:.0f} GiB -> physical bound ceil({peak_memory / GiB:.0f}/80) = {bound} GPUs"
    )
    print(f"strict FIFO queue; goal per policy: p95 wait <= {WAIT_GOAL_S:.0f} s; cards are 80 GiB")
    print()

    rows: list[tuple[PolicySpec, Outcome]] = []
    all_runs: dict[str, dict[int, Outcome]] = {}
    for spec in POLICIES:
        _, outcome, runs = smallest_gpus(trace, spec, start=bound)
        rows.append((spec, outcome))
        all_runs[spec.key] = runs

    header = (
        f"{'policy':<24} {'GPUs':>5} {'vs bound':>8} {'kernels/GPU':>11} {'reserved':>9} {'requested':>10} "
        f"{'p95 wait':>9} {'mean wait':>9} {'>300 s':>6} {'cannot run':>10}"
    )
    print(header)
    print("-" * len(header))
    for spec, outcome in rows:
        print(
            f"{spec.label:<24} {outcome.gpus:>5} {outcome.gpus - bound:>+8d} "
            f"{outcome.kernels_per_gpu:>11.2f} "
            f"{outcome.reserved_util:>9.0%} {outcome.requested_util:>10.0%} {outcome.p95:>8.0f}s "
            f"{outcome.mean_wait:>8.1f}s {outcome.over_timeout:>6} {outcome.rejected:>10}"
        )
    print(f"{'physical bound':<24} {bound:>5}")
    print()

    by_key = {spec.key: outcome for spec, outcome in rows}
    share = by_key["gpushare"]
    whole = by_key["whole-card"]
    slicing = by_key["timeslice-4"]
    mig = by_key["mig-7x1g"]
    print(
        f"(b) time-slicing: one 20 GiB replica per kernel whatever it needs; {slicing.over_replica} kernels "
        f"({slicing.over_replica / len(trace):.0%}) need more than 20 GiB; at {slicing.gpus} GPUs "
        f"{slicing.oom_starts} starts left a card's summed needs above 80 GiB (OOM on a real card), "
        f"{slicing.oom_card_time:.1%} of card-time oversubscribed"
    )
    print(
        f"(c) MIG 7x1g.10gb: {mig.rejected} kernels ({mig.rejected / len(trace):.0%}) need more than "
        f"10 GiB and cannot run at all; wait statistics cover the other {mig.runnable}"
    )
    print(
        f"(d) gpushare at {share.gpus} GPUs: {share.hol_kernels} kernels fitted on arrival but waited "
        f"behind an earlier request (strict FIFO); queue head blocked {share.blocked_s / 60:.0f} min of the "
        f"day, of which {share.fragmented_s / 60:.0f} min with enough free memory summed over cards "
        f"(fragmentation)"
    )
    below = all_runs["gpushare"].get(share.gpus - 1)
    fluid_needed, _, _ = smallest_gpus(trace, FLUID, start=bound)
    skip_needed, _, _ = smallest_gpus(trace, POLICIES[3], skip_ahead=True, start=bound)
    if below is not None:
        print(
            f"    at {below.gpus} GPUs: p95 wait {below.p95:.0f} s, {below.hol_kernels} head-of-line waits, "
            f"head blocked {below.blocked_s / 60:.0f} min, {below.fragmented_s / 60:.0f} min of it fragmented"
        )
    print(
        f"    counterfactuals: without fragmentation (all cards pooled into one device, strict FIFO) "
        f"{fluid_needed} GPUs; without head-of-line blocking (queue scanned past a blocked head) "
        f"{skip_needed} GPUs"
    )
    print()

    overbooked = sum(o.overbooked for runs in all_runs.values() for o in runs.values())
    simulated = sum(len(runs) for runs in all_runs.values())
    print(
        f"check: in all {simulated} simulation runs no device or MIG instance was ever reserved beyond its "
        f"memory or shared under a whole-card slice: {'yes' if overbooked == 0 else f'NO ({overbooked})'}"
    )
    excess = share.gpus - bound
    ratio = whole.gpus / share.gpus
    print(
        f"goal gpushare <= bound (+0): {'MET' if excess <= 0 else 'NOT MET'} "
        f"({share.gpus} GPUs vs bound {bound}, {excess:+d})"
    )
    verdict = "NOT MET" if ratio < 4.5 else "MET" if ratio < 5.5 else "MET, a larger saving than expected"
    print(
        f"goal whole-card about 5x gpushare: whole-card needs {whole.gpus} = {ratio:.1f}x gpushare: {verdict}"
        f" (the ratio tracks 80 GiB / mean request; this mix averages {sum(needs) / len(needs):.1f} GiB)"
    )

    if extra_days:
        print()
        print(f"robustness, {extra_days} more days (seeds {args.seed + 1}..{args.seed + extra_days}):")
        print(
            f"  {'seed':>10} {'kernels':>7} {'bound':>5} {'gpushare':>8} {'excess':>6} "
            f"{'whole':>5} {'ratio':>6}"
        )
        excesses = []
        for offset in range(1, extra_days + 1):
            day = generate_trace(args.seed + offset, args.users, args.kernels_per_user)
            day_bound = math.ceil(peak_demand(day)[0] / CARD)
            day_share, _, _ = smallest_gpus(day, POLICIES[3], start=day_bound)
            day_whole, _, _ = smallest_gpus(day, POLICIES[0], start=max(1, whole.gpus))
            excesses.append(day_share - day_bound)
            print(
                f"  {args.seed + offset:>10} {len(day):>7} {day_bound:>5} {day_share:>8} "
                f"{day_share - day_bound:>+6d} {day_whole:>5} {day_whole / day_share:>5.1f}x"
            )
        at_bound = sum(1 for e in excesses if e <= 0)
        print(
            f"  gpushare within the bound on {at_bound} of {len(excesses)} days; "
            f"worst excess {max(excesses):+d}"
        )

    if args.plot:
        _plot(args.plot, rows, bound, args.seed)
        print()
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
