"""Ledger throughput: allocate+release pairs per second on one sqlite node ledger.

Method
------
One ledger file in a fresh temporary directory holds a simulated pool of four 80 GiB cards
(``parse_simulation('4xA100-80GB')``, registered with ``Ledger.register_devices``). For each
process count (1, 2, 4 by default) that many OS processes are started with the ``spawn`` start
method; each opens its own :class:`jupyter_gpushare.backends.local.ledger.Ledger` on the file and, once every
process is ready, loops for a fixed wall-clock duration over the ledger calls a kernel start and
shutdown make, exactly as ``LocalBackend.acquire`` and ``release`` make them:

    Ledger.request(NewRequest(...), policy)  # enqueue + first placement attempt, one write txn
    Ledger.try_place(kernel_id, policy)      # only while the answer is Waiting
    Ledger.release(kernel_id)

Every write in the ledger (``request``, ``enqueue``, a ``try_place`` that may place, ``release``)
first takes a blocking ``fcntl.flock`` on ``<ledger>.lock``, so writers from all processes queue in
the kernel, and only then opens sqlite's ``BEGIN IMMEDIATE`` transaction. A ``try_place`` for a
request behind a live queued one is answered from a lock-free read (a deferred ``BEGIN`` snapshot
and one liveness check of the queue's head) without touching the file lock.

Sizes are drawn from a seeded RNG (512M-4G) so every request fits; the liveness check is the real
one (psutil), as in the package. A *pair* is one placed-and-released slice. The figure reported
is total pairs over all processes divided by the wall time of the measured window.

Variants differ in the first attempt or in what a client does when it is answered ``Waiting``:

* ``backoff`` (the headline, judged): ``request``, then sleep 1 ms between ``try_place`` polls.
* ``service``: ``request``, then sleep ``GPUShare().queue_poll_interval`` (0.25 s by default)
  between polls, exactly what ``LocalBackend.acquire`` does - the figure a burst of kernel
  starts on one node would see.
* ``spin`` (full run only): ``request``, then poll again at once.
* ``two-step`` (the comparison): a separate ``enqueue`` write, then ``try_place`` (1 ms backoff),
  the package's behaviour before ``Ledger.request``. Between the two writes another process can
  see the row queued and, under strict FIFO, must wait behind it; the difference to ``backoff``
  is what the combined call buys.

Correctness is checked at the end of every run: the ledger must hold no row, and every worker
must have seen each of its requests placed and then released exactly once (``release`` returning
the running row).

Each run also reports what its workers wrote per pair (``/proc/self/io``): the write-ahead log's
frames and the checkpoints' copies, nearly all of it set by the ledger's page size.

The process count sweep is sequential, so the machine's cores are shared only by the processes of
one run (and by whatever else runs on the machine: the load average is printed before and after).
Beyond the headline, a breakdown runs in this process: the cost of ``request``, ``try_place`` and
``release`` alone, the floor of an empty ``BEGIN IMMEDIATE``/``COMMIT`` on the same file and of the
same with the ``flock`` around it (what every ledger write pays), the cost of a polling round as the
queue grows, and a cProfile of the single-process loop (always: a second or two, and a part that
only ran on a miss could rot unseen), so that a miss can be attributed to sqlite, to the lock,
to locking between processes, or to Python work in the ledger.

``--against REV`` measures the package of git revision REV beside this checkout's in the same run
(a worktree under ``build/``, see ``against.py``): for each process count the two sides' runs
alternate, ``--repeat`` times each, and the ratio of their median pairs/s is printed. The workers
import the commit's package; the file is made and filled by its code only.

Goals: >= 2,000 pairs/s (total) at every process count, judged on the ``backoff`` rows; with
``--against``, pairs/s >= the commit's at every process count (issue 24: commit e14ae77).

Run: ``.venv/bin/python benchmarks/ledger_throughput.py`` (about 2 minutes; ``--quick`` < 60 s).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
import importlib
import io
import multiprocessing as mp
import os
import platform
import pstats
import queue
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from against import Revision, RevisionError, checkout, import_package_from

GOAL_PAIRS_PER_S = 2000.0
SIZES = ("512M", "1G", "2G", "4G")
POOL = "4xA100-80GB"

VARIANTS = ("backoff", "service", "spin", "two-step")
# A queued start that is still waiting after this long is stuck, not slow: the run fails.
PLACE_DEADLINE = 600.0


def _pause(variant: str) -> float:
    """Seconds a variant sleeps between ``try_place`` polls."""
    if variant == "service":
        from jupyter_gpushare.config import GPUShare

        return float(GPUShare().queue_poll_interval)
    return 0.0 if variant == "spin" else 0.001


def _median_rates(rows: list[dict[str, Any]], variant: str, figure: str = "rate") -> dict[int, float]:
    """pairs/s (or another figure) per process count: the median over repeated runs."""
    rates: dict[int, list[float]] = {}
    for row in rows:
        if row["variant"] == variant:
            rates.setdefault(row["processes"], []).append(row[figure])
    return {count: statistics.median(values) for count, values in rates.items()}


def _load() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def _written() -> int:
    """Bytes this process has written so far (``wchar`` of ``/proc/self/io``: the write-ahead
    log's frames and the checkpoints' copies, whether or not they reached the disk yet); -1
    where the file is missing (not Linux)."""
    try:
        with open("/proc/self/io") as counters:
            fields = dict(line.split(": ", 1) for line in counters.read().splitlines() if ": " in line)
        return int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return -1


def _api() -> SimpleNamespace:
    """The package's names the measurement uses, wherever the measured commit keeps them.

    Before commit 2c944eb (2026-11-30) the request and outcome types lived in the ledger module;
    ``--against`` an older commit finds them there.
    """
    from jupyter_gpushare.backends.local.inventory import parse_simulation
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.backends.processes import current_process
    from jupyter_gpushare.core.placement.allocator import Policy

    try:
        types = importlib.import_module("jupyter_gpushare.core.records")
    except ImportError:
        types = importlib.import_module("jupyter_gpushare.backends.local.ledger")
    return SimpleNamespace(
        Policy=Policy,
        parse_simulation=parse_simulation,
        Ledger=Ledger,
        current_process=current_process,
        NewRequest=types.NewRequest,
        Placed=types.Placed,
        Waiting=types.Waiting,
    )


def _setup_ledger(path: str) -> None:
    api = _api()
    ledger = api.Ledger(path)
    ledger.register_devices(api.parse_simulation(POOL).devices, True)
    ledger.close()


def _worker(
    worker: int,
    variant: str,
    path: str,
    seed: int,
    duration: float,
    ready: mp.synchronize.Barrier,
    setting_up: mp.synchronize.Lock,
    results: mp.Queue[Any],
    package_root: str | None,
) -> None:
    import_package_from(package_root)  # this checkout's package, or the --against commit's
    api = _api()
    sleep_for = _pause(variant)
    rng = random.Random(seed * 1000 + worker)
    # Every worker registers the pool (the same rows: the second and later change nothing), so
    # the file is made by the code being measured, never by this process's. One at a time: an
    # older commit's first open of a new file fails when another process opens it at once
    # ("database is locked" setting WAL), which is not what this measures.
    with setting_up:
        _setup_ledger(path)
    ledger = api.Ledger(path)
    ledger.devices()  # open the connection before the clock starts
    me = api.current_process()
    policy = api.Policy()
    pairs = waits = queued = 0
    latencies: list[float] = []
    ready.wait()
    start = time.perf_counter()
    cpu_start = time.process_time()  # the worker's threads, lock helpers included
    written_start = _written()
    deadline = start + duration
    now = start
    while now < deadline:
        kernel_id = f"w{worker}-{pairs}"
        t0 = now
        request = api.NewRequest(
            kernel_id=kernel_id,
            owner=f"user{worker}",
            server_id=f"bench-{worker}",
            mode="timeslice",
            placement="shared",
            size=rng.choice(SIZES),
            cores=None,
            holder=me,
        )
        if variant == "two-step":
            ledger.enqueue(request)
            outcome = ledger.try_place(kernel_id, policy)
        else:
            outcome = ledger.request(request, policy)
        if not isinstance(outcome, api.Placed):
            queued += 1
        wait_deadline = time.perf_counter() + PLACE_DEADLINE
        while not isinstance(outcome, api.Placed):
            if time.perf_counter() > wait_deadline:
                raise RuntimeError(f"worker {worker}: {kernel_id} not placed after {PLACE_DEADLINE:g} s")
            if not isinstance(outcome, api.Waiting):
                raise RuntimeError(f"worker {worker}: unexpected outcome {outcome!r}")
            waits += 1
            if sleep_for:
                time.sleep(sleep_for)
            outcome = ledger.try_place(kernel_id, policy)
        if outcome.record.kernel_id != kernel_id or outcome.record.state != "running":
            raise RuntimeError(f"worker {worker}: placed {outcome.record!r} for {kernel_id}")
        released = ledger.release(kernel_id)
        if released is None or released.state != "running":
            raise RuntimeError(f"worker {worker}: release of {kernel_id} returned {released!r}")
        pairs += 1
        now = time.perf_counter()
        latencies.append(now - t0)
    written = _written() - written_start  # before close: a last checkpoint is not the loop's
    ledger.close()
    cpu = time.process_time() - cpu_start
    results.put((worker, pairs, waits, queued, now - start, latencies, cpu, written))


def run_processes(
    variant: str,
    processes: int,
    duration: float,
    seed: int,
    directory: Path,
    revision: Revision | None = None,
) -> dict[str, Any]:
    """One measured run; ``revision``: the package of that commit instead of this checkout's."""
    code = revision.short if revision is not None else "ours"
    path = str(directory / f"ledger-{variant}-{processes}-{code}-{time.monotonic_ns()}.sqlite")
    context = mp.get_context("spawn")
    barrier = context.Barrier(processes)
    setting_up = context.Lock()
    results: mp.Queue[Any] = context.Queue()
    root = str(revision.root) if revision is not None else None
    workers = [
        context.Process(
            target=_worker, args=(i, variant, path, seed, duration, barrier, setting_up, results, root)
        )
        for i in range(processes)
    ]
    for process in workers:
        process.start()
    collected: list[Any] = []
    give_up = time.monotonic() + duration + 120
    while len(collected) < processes:
        try:
            collected.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in workers if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > give_up:
                for process in workers:
                    process.kill()
                raise RuntimeError(f"workers failed (exit codes {failed}) or timed out") from None
    for process in workers:
        process.join(timeout=30)
        if process.exitcode != 0:
            raise RuntimeError(f"a worker exited with {process.exitcode}")

    # Read with plain sqlite: the file is the measured commit's, whatever its code looks like.
    with contextlib.closing(sqlite3.connect(path)) as connection:
        leftover = int(connection.execute("SELECT COUNT(*) FROM slices").fetchone()[0])
    if leftover:
        raise AssertionError(f"ledger not empty after the run ({code}): {leftover} rows left")
    pairs = sum(item[1] for item in collected)
    waits = sum(item[2] for item in collected)
    queued = sum(item[3] for item in collected)
    wall = max(item[4] for item in collected)
    latencies = sorted(lat for item in collected for lat in item[5])
    return {
        "code": code,
        "variant": variant,
        "processes": processes,
        "pairs": pairs,
        "waits": waits,
        "queued": queued,
        "wall": wall,
        "rate": pairs / wall,
        # CPU per pair, all workers together: steadier than pairs/s on a busy machine, and it
        # counts what waiting for the lock costs the waiters.
        "cpu_us": 1e6 * sum(item[6] for item in collected) / max(1, pairs),
        # What a pair writes (the page size decides most of it), or -1 where it cannot be read.
        "kib": sum(item[7] for item in collected) / 1024 / max(1, pairs)
        if all(item[7] >= 0 for item in collected)
        else -1.0,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max_ms": 1000 * latencies[-1],
        "empty": not leftover,
    }


# ---- breakdown in this process ----------------------------------------------------------------


def _time_calls(directory: Path, count: int, seed: int) -> dict[str, float]:
    """Microseconds per call of the ledger calls alone, and of the transaction floors."""
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.backends.processes import current_process, is_alive
    from jupyter_gpushare.core.placement.allocator import Policy
    from jupyter_gpushare.core.records import NewRequest, Placed, Waiting

    path = str(directory / "ledger-breakdown.sqlite")
    _setup_ledger(path)
    ledger = Ledger(path)
    me = current_process()
    policy = Policy()
    rng = random.Random(seed)
    spent = dict.fromkeys(("request", "release", "enqueue", "try_place", "try_place_read"), 0.0)

    def new(kernel_id: str) -> Any:
        return NewRequest(kernel_id, "u", "s", "timeslice", "shared", rng.choice(SIZES), None, me)

    # The package's path: request (placed at once), release.
    for i in range(count):
        kernel_id = f"r{i}"
        request = new(kernel_id)
        t0 = time.perf_counter()
        outcome = ledger.request(request, policy)
        t1 = time.perf_counter()
        ledger.release(kernel_id)
        t2 = time.perf_counter()
        assert isinstance(outcome, Placed)
        spent["request"] += t1 - t0
        spent["release"] += t2 - t1
    # The two-step path: enqueue, then try_place at the head of the queue (the write path).
    for i in range(count):
        kernel_id = f"t{i}"
        request = new(kernel_id)
        t0 = time.perf_counter()
        ledger.enqueue(request)
        t1 = time.perf_counter()
        outcome = ledger.try_place(kernel_id, policy)
        t2 = time.perf_counter()
        ledger.release(kernel_id)
        assert isinstance(outcome, Placed)
        spent["enqueue"] += t1 - t0
        spent["try_place"] += t2 - t1
    # A poll behind a live queued request: answered from the lock-free read.
    ledger.enqueue(new("blocker"))
    ledger.enqueue(new("behind"))
    t0 = time.perf_counter()
    for _ in range(count):
        outcome = ledger.try_place("behind", policy)
    spent["try_place_read"] = time.perf_counter() - t0
    assert isinstance(outcome, Waiting)
    ledger.release("behind")
    ledger.release("blocker")
    ledger.close()

    # The floors: one empty BEGIN IMMEDIATE/COMMIT with the ledger's pragmas, and the same inside
    # the flock on <ledger>.lock that every ledger write (LedgerAccess.transact) takes first.
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    connection.execute("PRAGMA synchronous = NORMAL")
    t0 = time.perf_counter()
    for _ in range(count):
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("COMMIT")
    empty = time.perf_counter() - t0
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    t0 = time.perf_counter()
    for _ in range(count):
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("COMMIT")
        fcntl.flock(lock, fcntl.LOCK_UN)
    locked = time.perf_counter() - t0
    os.close(lock)
    # A new connection per transaction (what a cache miss or a fresh Ledger per call would cost).
    t0 = time.perf_counter()
    for _ in range(count // 10):
        fresh = sqlite3.connect(path, isolation_level=None, timeout=30)
        fresh.execute("BEGIN IMMEDIATE")
        fresh.execute("COMMIT")
        fresh.close()
    fresh_cost = (time.perf_counter() - t0) / (count // 10)
    connection.close()

    t0 = time.perf_counter()
    for _ in range(count):
        is_alive(me)
    alive_cost = (time.perf_counter() - t0) / count
    result = {name: 1e6 * value / count for name, value in spent.items()}
    result["is_alive"] = 1e6 * alive_cost
    result["empty_txn"] = 1e6 * empty / count
    result["flock_txn"] = 1e6 * locked / count
    result["fresh_connection_txn"] = 1e6 * fresh_cost
    return result


def _poll_cost(directory: Path, depths: list[int], repeats: int = 3) -> list[tuple[int, float, float]]:
    """One polling round when ``depth`` requests wait behind a full pool: (depth, round s, head s).

    A round is what happens every ``queue_poll_interval``: each waiting request calls
    ``try_place`` once. Only the head of the queue takes the write lock (and finds no room); the
    others are answered from the lock-free read. The fastest of ``repeats`` rounds is kept, since
    a single round of a few milliseconds is easily stretched by other work on the machine.
    """
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.backends.processes import current_process
    from jupyter_gpushare.core.placement.allocator import Policy
    from jupyter_gpushare.core.records import NewRequest, Placed, Waiting

    path = str(directory / "ledger-queue.sqlite")
    _setup_ledger(path)
    ledger = Ledger(path)
    me = current_process()
    policy = Policy()
    for card in range(4):  # fill the pool so everything after waits
        full = NewRequest(f"full{card}", "u", "s", "timeslice", "shared", "80G", None, me)
        assert isinstance(ledger.request(full, policy), Placed)
    rounds = []
    for depth in depths:
        names = [f"q{depth}-{i}" for i in range(depth)]
        for name in names:
            waiter = NewRequest(name, "u", "s", "timeslice", "shared", "1G", None, me)
            assert isinstance(ledger.request(waiter, policy), Waiting)
        best: tuple[float, float] | None = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            ledger.try_place(names[0], policy)
            t1 = time.perf_counter()
            for name in names[1:]:
                ledger.try_place(name, policy)
            measured = (time.perf_counter() - t0, t1 - t0)
            best = measured if best is None or measured < best else best
        assert best is not None
        rounds.append((depth, *best))
        for name in names:
            ledger.release(name)
    ledger.close()
    return rounds


def _profile(directory: Path, count: int, seed: int, top: int = 14) -> tuple[str, str]:
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.backends.local.ledger.schema import read_devices, record_of
    from jupyter_gpushare.backends.processes import current_process
    from jupyter_gpushare.core.placement.allocator import Policy, fit
    from jupyter_gpushare.core.records import NewRequest
    from jupyter_gpushare.core.sizes import parse_size

    path = str(directory / "ledger-profile.sqlite")
    _setup_ledger(path)
    ledger = Ledger(path)
    me = current_process()
    policy = Policy()
    rng = random.Random(seed)

    def loop() -> None:
        for i in range(count):
            kernel_id = f"p{i}"
            size = rng.choice(SIZES)
            ledger.request(NewRequest(kernel_id, "u", "s", "timeslice", "shared", size, None, me), policy)
            ledger.release(kernel_id)

    profiler = cProfile.Profile()
    profiler.runcall(loop)
    ledger.close()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    total = stats.total_tt  # type: ignore[attr-defined]

    def own(predicate: Any) -> float:
        return sum(v[2] for k, v in stats.stats.items() if predicate(k))  # type: ignore[attr-defined]

    def cumulative(function: Callable[..., Any]) -> float:
        # Named by the function object, not by its name: a renamed function fails the import
        # above instead of silently reporting nothing.
        code = function.__code__
        return sum(
            v[3]
            for k, v in stats.stats.items()  # type: ignore[attr-defined]
            if k[0] == code.co_filename and k[2] == code.co_name
        )

    sqlite_calls = own(
        lambda k: k[0] == "~" and any(name in k[2] for name in ("'execute'", "'fetchone'", "'fetchall'"))
    )
    flock_calls = own(lambda k: k[0] == "~" and "flock" in k[2])
    parts = [
        ("sqlite statements (execute/fetch, incl. COMMIT)", sqlite_calls),
        ("fcntl.flock (lock + unlock, uncontended)", flock_calls),
        ("read_devices (devices table + json per call)", cumulative(read_devices)),
        ("record_of (row -> SliceRecord)", cumulative(record_of)),
        ("allocator.fit", cumulative(fit)),
        ("parse_size", cumulative(parse_size)),
    ]
    lines = [f"  total {1e6 * total / count:.0f} us per pair (request + release, under the profiler)"]
    for label, seconds in parts:
        lines.append(f"  {label:<48}{1e6 * seconds / count:>6.0f} us  {seconds / total:>4.0%}")
    lines.append("  (read_devices includes its own SELECT; the other rows exclude sqlite)")
    stats.sort_stats("tottime").print_stats(top)
    text = stream.getvalue()
    raw = [line.replace(str(Path(sys.prefix)), "<venv>") for line in text.splitlines()]
    start = next((i for i, line in enumerate(raw) if "ncalls" in line), 0)
    return "\n".join(lines), "\n".join(raw[start:]).rstrip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds measured per run")
    parser.add_argument("--processes", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--quick", action="store_true", help="2.5 s runs, no 'spin' variant (CI)")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also measure the package of git revision REV (a worktree under build/), interleaved "
        "with this checkout's runs, and print the ratio; only the backoff variant unless --variants",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per process count and side (medians are compared)"
    )
    args = parser.parse_args(argv)
    duration = 2.5 if args.quick else args.duration
    try:
        counts = [int(item) for item in args.processes.split(",") if item.strip()]
    except ValueError:
        parser.error(f"--processes takes whole numbers separated by commas, not {args.processes!r}")
    if not counts or min(counts) < 1 or args.repeat < 1 or duration <= 0:
        parser.error("--processes needs counts >= 1, --repeat >= 1 and --duration > 0")
    if args.variants:
        variants = [item.strip() for item in args.variants.split(",") if item.strip()]
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}")
    elif args.against:
        variants = ["backoff"]
    else:
        variants = [v for v in VARIANTS if not (args.quick and v == "spin")]
    try:
        with contextlib.ExitStack() as stack:
            revision = stack.enter_context(checkout(args.against)) if args.against else None
            return _run(args, duration, counts, variants, revision)
    except RevisionError as error:
        print(f"ledger_throughput: {error}", file=sys.stderr)
        return 2


def _run(
    args: argparse.Namespace,
    duration: float,
    counts: list[int],
    variants: list[str],
    revision: Revision | None,
) -> int:
    print("Ledger throughput: request -> (try_place while Waiting) -> release pairs on one sqlite ledger")
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, sqlite {sqlite3.sqlite_version}"
    )
    print(f"pool {POOL} (simulated), sizes {', '.join(SIZES)}, {duration:g} s per run, seed {args.seed}")
    if revision is not None:
        print(
            f"against {revision.label} (commit {revision.short}, worktree {revision.root}): its runs "
            f"interleaved with this checkout's (ours), {args.repeat} per process count and side"
        )
    print(f"load average at start: {_load()} (other work on the machine lowers every figure)")
    print()

    sides: list[Revision | None] = [None] if revision is None else [None, revision]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        directory = Path(tmp)
        for variant in variants:
            for processes in counts:
                for repeat in range(args.repeat):
                    # Which side goes first alternates, so a drift of the machine's load hits both.
                    order = sides if (repeat + processes) % 2 == 0 else sides[::-1]
                    for side in order:
                        rows.append(run_processes(variant, processes, duration, args.seed, directory, side))

        header = (
            f"{'code':<10} {'variant':<9} {'procs':>5} {'pairs':>7} {'pairs/s':>8} {'queued':>7} "
            f"{'waits':>7} {'p50 ms':>7} {'p99 ms':>8} {'max ms':>8} {'CPU us':>7} {'KiB w':>6} {'empty':>5} "
            f"{'goal':>5}"
        )
        print(header)
        print("-" * len(header))
        for row in rows:
            judged = row["variant"] == "backoff" and row["code"] == "ours"
            verdict = ("ok" if row["rate"] >= GOAL_PAIRS_PER_S else "MISS") if judged else "-"
            written = f"{row['kib']:.1f}" if row["kib"] >= 0 else "?"
            print(
                f"{row['code']:<10} {row['variant']:<9} {row['processes']:>5} {row['pairs']:>7} "
                f"{row['rate']:>8.0f} {row['queued']:>7} {row['waits']:>7} {row['p50_ms']:>7.2f} "
                f"{row['p99_ms']:>8.2f} {row['max_ms']:>8.1f} {row['cpu_us']:>7.0f} "
                f"{written:>6} "
                f"{'yes' if row['empty'] else 'NO':>5} "
                f"{verdict:>5}"
            )
        print("(queued: requests whose first attempt answered Waiting although the pool had room -")
        print(" strict FIFO behind another process's row that was queued at that moment; waits: all")
        print(" Waiting answers, polls included; CPU us: the workers' CPU time per pair; KiB w: what")
        print(" the workers wrote per pair, the write-ahead log's frames and the checkpoints)")
        print()

        ours = [row for row in rows if row["code"] == "ours"]
        judged_rows = [row for row in ours if row["variant"] == "backoff"] or ours
        worst = min(judged_rows, key=lambda row: row["rate"])
        met = all(row["rate"] >= GOAL_PAIRS_PER_S for row in judged_rows)
        print(
            f"goal >= {GOAL_PAIRS_PER_S:,.0f} pairs/s at every process count ({worst['variant']}): "
            f"{'MET' if met else 'NOT MET'} - lowest {worst['rate']:,.0f}/s with {worst['processes']} "
            f"process{'es' if worst['processes'] > 1 else ''}, ratio to goal "
            f"{worst['rate'] / GOAL_PAIRS_PER_S:.2f}"
        )
        backoff = _median_rates(ours, "backoff")
        two_step = _median_rates(ours, "two-step")
        if two_step:
            low = min(two_step, key=lambda count: two_step[count])
            print(
                f"two-step (enqueue, then try_place): lowest {two_step[low]:,.0f}/s "
                f"({low} process{'es' if low > 1 else ''}), ratio to goal "
                f"{two_step[low] / GOAL_PAIRS_PER_S:.2f}"
            )
            both = [n for n in counts if n in backoff and n in two_step]
            gains = [f"x{backoff[n] / two_step[n]:.2f} at {n}" for n in both]
            if gains:
                print(f"what Ledger.request buys (backoff / two-step pairs/s): {', '.join(gains)}")
        if revision is not None:
            theirs = [row for row in rows if row["code"] == revision.short]
            for variant in variants:
                mine, other = _median_rates(ours, variant), _median_rates(theirs, variant)
                ratios = {n: mine[n] / other[n] for n in counts if n in mine and other.get(n)}
                listed = ", ".join(f"x{ratio:.2f} at {n}" for n, ratio in ratios.items())
                print(f"against {revision.label} ({variant}, ours / {revision.short} pairs/s): {listed}")
                mine_cpu, other_cpu = (_median_rates(side, variant, "cpu_us") for side in (ours, theirs))
                cpu = ", ".join(
                    f"x{mine_cpu[n] / other_cpu[n]:.2f} at {n}" for n in counts if other_cpu.get(n)
                )
                print(f"  CPU per pair, ours / {revision.short} (lower is better): {cpu}")
                if variant == "backoff":
                    kept = all(ratio >= 1.0 for ratio in ratios.values())
                    print(
                        f"goal pairs/s >= {revision.label}'s at every process count: "
                        f"{'MET' if kept else 'NOT MET'} (lowest x{min(ratios.values()):.2f})"
                    )
        print("correctness: ledger empty after every run, every request placed and released once: yes")
        print(f"load average after the runs: {_load()}")
        print()

        count = 600 if args.quick else 2000
        costs = _time_calls(directory, count, args.seed)
        pair = costs["request"] + costs["release"]
        two = costs["enqueue"] + costs["try_place"] + costs["release"]
        print(f"breakdown, one process, {count} pairs (microseconds per call):")

        def line(label: str, value: float, note: str = "") -> None:
            print(f"  {label:<24}{value:>8.0f}   {note}".rstrip())

        pad = " " * 37
        line("request", costs["request"], "(enqueue + placement, one write transaction)")
        line("release", costs["release"])
        line("= one pair", pair, f"({1e6 / pair:,.0f} pairs/s; nearly all of it runs under the write")
        print(f"{pad}lock, so more processes cannot add much)")
        line("enqueue (two-step)", costs["enqueue"])
        line("try_place (places)", costs["try_place"], "(read snapshot, then write transaction)")
        line("= two-step pair", two, f"({1e6 / two:,.0f} pairs/s)")
        line("try_place (Waiting)", costs["try_place_read"], "(behind a live row: lock-free read + is_alive)")
        line("empty write txn", costs["empty_txn"], "(BEGIN IMMEDIATE; COMMIT)")
        line("flock + write txn", costs["flock_txn"], "(what every ledger write pays; 2 per pair)")
        line("new connection + txn", costs["fresh_connection_txn"], "(connections are reused: not paid)")
        line("is_alive (psutil)", costs["is_alive"], "(once per poll behind a live row; not paid")
        print(f"{pad}by request/release when nothing is queued)")
        share = 2 * costs["flock_txn"] / pair
        print(f"  flock + bare sqlite transaction: {share:.0%} of a pair; the rest is statements and Python")
        print()
        from jupyter_gpushare.config import GPUShare

        interval = GPUShare().queue_poll_interval
        depths = [10, 50, 100] if args.quick else [10, 50, 100, 200]
        print(f"polling cost with a full pool: each waiting request calls try_place every {interval:g} s")
        print(f"  {'queued':>6} {'one round ms':>12} {'per poll us':>11} {'head us':>8} {'busy':>6}")
        for depth, seconds, head in _poll_cost(directory, depths):
            print(
                f"  {depth:>6} {1000 * seconds:>12.1f} {1e6 * seconds / depth:>11.0f} {1e6 * head:>8.0f} "
                f"{seconds / interval:>6.1%}"
            )
        print("  (fastest of 3 rounds; head: the first in line, the only poll that takes the write lock;")
        print("   the others read without it and check only the head's process; busy: a round's share")
        print("   of the interval)")
        # Always (a second or two), so that it cannot rot unnoticed: CI runs --quick.
        print()
        summary, table = _profile(directory, count, args.seed)
        print(f"cProfile of the single-process loop ({count} pairs):")
        print(summary)
        print()
        print("top functions by own time:")
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
