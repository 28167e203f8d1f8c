"""Ledger throughput: allocate+release pairs per second on one sqlite node ledger.

Method
------
One ledger file in a fresh temporary directory holds a simulated pool of four 80 GiB cards
(``parse_simulation('4xA100-80GB')``, registered with ``Ledger.register_devices``). For each
process count (1, 2, 4 by default) that many OS processes are started with the ``spawn`` start
method; each opens its own :class:`jupyter_gpushare.ledger.Ledger` on the file and, once every
process is ready, loops for a fixed wall-clock duration over the exact calls a kernel start and
shutdown make:

    Ledger.enqueue(NewRequest(...))   # queued row
    Ledger.try_place(kernel_id, ...)  # repeated while it answers Waiting (strict FIFO: another
                                      # process's earlier request is still queued)
    Ledger.release(kernel_id)

Sizes are drawn from a seeded RNG (512M-4G) so every request fits; the liveness check is the real
one (psutil), as in the package. A *pair* is one placed-and-released slice. The figure reported
is total pairs over all processes divided by the wall time of the measured window.

What a client does when ``try_place`` answers ``Waiting`` matters a great deal once several
processes share the ledger (another process's row can sit queued between its ``enqueue`` and its
``try_place``, and strict FIFO makes everyone behind it wait), so it is measured as a variant:

* ``backoff`` (the headline): sleep 1 ms, then ask again - a client that yields the write lock.
* ``service``: sleep ``GPUShare.queue_poll_interval`` (0.25 s by default), exactly what
  ``GPUShareService.acquire`` does - the figure a burst of kernel starts on one node would see.
* ``spin`` (full run only): ask again at once - shows sqlite's busy-handler starvation.
* ``one-txn`` (a what-if, not the package's behaviour): ``enqueue`` and the first ``try_place``
  run inside one write transaction (this script wraps both calls in a re-entrant ``_write`` of a
  ``Ledger`` subclass), so a request that fits never becomes a visible queued row. It estimates
  what the suggested fix would buy; the package code is not changed.

Correctness is checked at the end of every run: the ledger must hold no row, and every worker
must have seen each of its requests placed exactly once.

The process count sweep is sequential, so the machine's cores are shared only by the processes of
one run. Beyond the headline, a breakdown runs in this process: the cost of each call alone, the
floor of an empty ``BEGIN IMMEDIATE``/``COMMIT`` on the same file, and (``--profile``, or
automatically when the goal is missed) a cProfile of the single-process loop, so that a miss can be
attributed to sqlite, to locking between processes, or to Python work in ``ledger.py``.

Goal: >= 2,000 pairs/s (total) at every process count, judged on the ``backoff`` rows.

Run: ``.venv/bin/python benchmarks/ledger_throughput.py`` (about 2 minutes; ``--quick`` < 60 s).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import platform
import pstats
import queue
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL_PAIRS_PER_S = 2000.0
SIZES = ("512M", "1G", "2G", "4G")
POOL = "4xA100-80GB"


VARIANTS = ("backoff", "service", "spin", "one-txn")


def _make_ledger(path: str, variant: str) -> Any:
    from jupyter_gpushare.ledger import Ledger

    if variant != "one-txn":
        return Ledger(path)

    class OneTransactionLedger(Ledger):
        """What-if: a write inside an open write transaction joins it instead of nesting."""

        @contextmanager
        def _write(self) -> Iterator[sqlite3.Connection]:
            connection = self._connection()
            if connection.in_transaction:
                yield connection
                return
            with super()._write() as db:
                yield db

    return OneTransactionLedger(path)


def _setup_ledger(path: str) -> None:
    from jupyter_gpushare.inventory import parse_simulation
    from jupyter_gpushare.ledger import Ledger

    ledger = Ledger(path)
    ledger.register_devices(parse_simulation(POOL).devices, True)
    ledger.close()


def _worker(
    worker: int,
    variant: str,
    path: str,
    seed: int,
    duration: float,
    ready: mp.synchronize.Barrier,
    results: mp.Queue[Any],
) -> None:
    from jupyter_gpushare.allocator import Policy
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.ledger import NewRequest, Placed, Waiting
    from jupyter_gpushare.processes import current_process

    pause = {"backoff": 0.001, "service": GPUShare().queue_poll_interval, "spin": 0.0, "one-txn": 0.001}
    sleep_for = pause[variant]
    rng = random.Random(seed * 1000 + worker)
    ledger = _make_ledger(path, variant)
    ledger.devices()  # open the connection before the clock starts
    me = current_process()
    policy = Policy()
    pairs = waits = 0
    latencies: list[float] = []
    ready.wait()
    start = time.perf_counter()
    deadline = start + duration
    now = start
    while now < deadline:
        kernel_id = f"w{worker}-{pairs}"
        t0 = now
        request = NewRequest(
            kernel_id=kernel_id,
            owner=f"user{worker}",
            server_id=f"bench-{worker}",
            mode="timeslice",
            kind="shared",
            size=rng.choice(SIZES),
            cores=None,
            holder=me,
        )
        if variant == "one-txn":
            with ledger._write():
                ledger.enqueue(request)
                outcome = ledger.try_place(kernel_id, policy)
        else:
            ledger.enqueue(request)
            outcome = ledger.try_place(kernel_id, policy)
        while not isinstance(outcome, Placed):
            if not isinstance(outcome, Waiting):
                raise RuntimeError(f"worker {worker}: unexpected outcome {outcome!r}")
            waits += 1
            if sleep_for:
                time.sleep(sleep_for)
            outcome = ledger.try_place(kernel_id, policy)
        released = ledger.release(kernel_id)
        if released is None or released.state != "running":
            raise RuntimeError(f"worker {worker}: release of {kernel_id} returned {released!r}")
        pairs += 1
        now = time.perf_counter()
        latencies.append(now - t0)
    ledger.close()
    results.put((worker, pairs, waits, now - start, latencies))


def run_processes(
    variant: str, processes: int, duration: float, seed: int, directory: Path
) -> dict[str, Any]:
    path = str(directory / f"ledger-{variant}-{processes}.sqlite")
    _setup_ledger(path)
    context = mp.get_context("spawn")
    barrier = context.Barrier(processes)
    results: mp.Queue[Any] = context.Queue()
    workers = [
        context.Process(target=_worker, args=(i, variant, path, seed, duration, barrier, results))
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

    from jupyter_gpushare.ledger import Ledger

    ledger = Ledger(path)
    leftover = ledger.records()
    ledger.close()
    if leftover:
        raise AssertionError(f"ledger not empty after the run: {len(leftover)} rows left")
    pairs = sum(item[1] for item in collected)
    waits = sum(item[2] for item in collected)
    wall = max(item[3] for item in collected)
    latencies = sorted(lat for item in collected for lat in item[4])
    return {
        "variant": variant,
        "processes": processes,
        "pairs": pairs,
        "waits": waits,
        "wall": wall,
        "rate": pairs / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max_ms": 1000 * latencies[-1],
        "empty": not leftover,
    }


# ---- breakdown in this process ----------------------------------------------------------------


def _time_calls(directory: Path, count: int, seed: int) -> dict[str, float]:
    """Microseconds per call of enqueue, try_place, release; and of an empty write transaction."""
    from jupyter_gpushare.allocator import Policy
    from jupyter_gpushare.ledger import Ledger, NewRequest
    from jupyter_gpushare.processes import current_process

    path = str(directory / "ledger-breakdown.sqlite")
    _setup_ledger(path)
    ledger = Ledger(path)
    me = current_process()
    policy = Policy()
    rng = random.Random(seed)
    spent = {"enqueue": 0.0, "try_place": 0.0, "release": 0.0}
    for i in range(count):
        kernel_id = f"b{i}"
        request = NewRequest(kernel_id, "u", "s", "timeslice", "shared", rng.choice(SIZES), None, me)
        t0 = time.perf_counter()
        ledger.enqueue(request)
        t1 = time.perf_counter()
        ledger.try_place(kernel_id, policy)
        t2 = time.perf_counter()
        ledger.release(kernel_id)
        t3 = time.perf_counter()
        spent["enqueue"] += t1 - t0
        spent["try_place"] += t2 - t1
        spent["release"] += t3 - t2
    ledger.close()

    # The floor: one empty BEGIN IMMEDIATE/COMMIT with the same pragmas as the ledger.
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    connection.execute("PRAGMA synchronous = NORMAL")
    t0 = time.perf_counter()
    for _ in range(count):
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("COMMIT")
    empty = time.perf_counter() - t0
    # A new connection per transaction (what a cache miss or a fresh Ledger per call would cost).
    t0 = time.perf_counter()
    for _ in range(count // 10):
        fresh = sqlite3.connect(path, isolation_level=None, timeout=30)
        fresh.execute("BEGIN IMMEDIATE")
        fresh.execute("COMMIT")
        fresh.close()
    fresh_cost = (time.perf_counter() - t0) / (count // 10)
    connection.close()
    from jupyter_gpushare.processes import is_alive

    t0 = time.perf_counter()
    for _ in range(count):
        is_alive(me)
    alive_cost = (time.perf_counter() - t0) / count
    result = {name: 1e6 * value / count for name, value in spent.items()}
    result["is_alive"] = 1e6 * alive_cost
    result["empty_txn"] = 1e6 * empty / count
    result["fresh_connection_txn"] = 1e6 * fresh_cost
    return result


def _poll_cost(directory: Path, depths: list[int]) -> list[tuple[int, float]]:
    """Seconds one polling round takes when ``depth`` requests wait behind a full pool.

    A round is what happens every ``queue_poll_interval``: each waiting request calls
    ``try_place`` once (all of it under the write lock).
    """
    from jupyter_gpushare.allocator import Policy
    from jupyter_gpushare.ledger import Ledger, NewRequest, Placed
    from jupyter_gpushare.processes import current_process

    path = str(directory / "ledger-queue.sqlite")
    _setup_ledger(path)
    ledger = Ledger(path)
    me = current_process()
    policy = Policy()
    for card in range(4):  # fill the pool so everything after waits
        ledger.enqueue(NewRequest(f"full{card}", "u", "s", "timeslice", "shared", "80G", None, me))
        assert isinstance(ledger.try_place(f"full{card}", policy), Placed)
    rounds = []
    for depth in depths:
        names = [f"q{depth}-{i}" for i in range(depth)]
        for name in names:
            ledger.enqueue(NewRequest(name, "u", "s", "timeslice", "shared", "1G", None, me))
        t0 = time.perf_counter()
        for name in names:
            ledger.try_place(name, policy)
        rounds.append((depth, time.perf_counter() - t0))
        for name in names:
            ledger.release(name)
    ledger.close()
    return rounds


def _profile(directory: Path, count: int, seed: int, top: int = 14) -> tuple[str, str]:
    from jupyter_gpushare.allocator import Policy
    from jupyter_gpushare.ledger import Ledger, NewRequest
    from jupyter_gpushare.processes import current_process

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
            ledger.enqueue(NewRequest(kernel_id, "u", "s", "timeslice", "shared", size, None, me))
            ledger.try_place(kernel_id, policy)
            ledger.release(kernel_id)

    profiler = cProfile.Profile()
    profiler.runcall(loop)
    ledger.close()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    total = stats.total_tt  # type: ignore[attr-defined]

    def own(predicate: Any) -> float:
        return sum(v[2] for k, v in stats.stats.items() if predicate(k))  # type: ignore[attr-defined]

    def cumulative(filename_end: str, function: str) -> float:
        return sum(
            v[3]
            for k, v in stats.stats.items()  # type: ignore[attr-defined]
            if k[0].endswith(filename_end) and k[2] == function
        )

    sqlite_calls = own(
        lambda k: k[0] == "~" and any(name in k[2] for name in ("'execute'", "'fetchone'", "'fetchall'"))
    )
    parts = [
        ("sqlite statements (execute/fetch, incl. COMMIT)", sqlite_calls),
        ("_read_devices (devices table + json per call)", cumulative("ledger.py", "_read_devices")),
        ("_record (row -> SliceRecord)", cumulative("ledger.py", "_record")),
        ("allocator.fit", cumulative("allocator.py", "fit")),
        ("parse_size", cumulative("sizes.py", "parse_size")),
    ]
    lines = [f"  total {1e6 * total / count:.0f} us per pair"]
    for label, seconds in parts:
        lines.append(f"  {label:<48}{1e6 * seconds / count:>6.0f} us  {seconds / total:>4.0%}")
    lines.append("  (_read_devices includes its own SELECT; the other rows exclude sqlite)")
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
    parser.add_argument("--profile", action="store_true", help="always print the cProfile breakdown")
    args = parser.parse_args(argv)
    duration = 2.5 if args.quick else args.duration
    counts = [int(item) for item in args.processes.split(",") if item.strip()]
    if args.variants:
        variants = [item.strip() for item in args.variants.split(",") if item.strip()]
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}")
    else:
        variants = [v for v in VARIANTS if not (args.quick and v == "spin")]

    print("Ledger throughput: enqueue -> try_place -> release pairs on one sqlite ledger")
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, sqlite {sqlite3.sqlite_version}"
    )
    print(f"pool {POOL} (simulated), sizes {', '.join(SIZES)}, {duration:g} s per run, seed {args.seed}")
    print()

    rows = []
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        directory = Path(tmp)
        for variant in variants:
            for processes in counts:
                rows.append(run_processes(variant, processes, duration, args.seed, directory))

        header = (
            f"{'variant':<9} {'procs':>5} {'pairs':>7} {'pairs/s':>8} {'waits':>7} "
            f"{'p50 ms':>7} {'p99 ms':>8} {'max ms':>8} {'empty':>5} {'goal':>5}"
        )
        print(header)
        print("-" * len(header))
        for row in rows:
            judged = row["variant"] == "backoff"
            verdict = ("ok" if row["rate"] >= GOAL_PAIRS_PER_S else "MISS") if judged else "-"
            print(
                f"{row['variant']:<9} {row['processes']:>5} {row['pairs']:>7} {row['rate']:>8.0f} "
                f"{row['waits']:>7} {row['p50_ms']:>7.2f} {row['p99_ms']:>8.2f} {row['max_ms']:>8.1f} "
                f"{'yes' if row['empty'] else 'NO':>5} {verdict:>5}"
            )
        print("(waits: try_place calls answered Waiting although the pool had room - strict FIFO")
        print(" behind another process's row queued between its enqueue and its try_place)")
        print()

        judged_rows = [row for row in rows if row["variant"] == "backoff"] or rows
        worst = min(judged_rows, key=lambda row: row["rate"])
        met = all(row["rate"] >= GOAL_PAIRS_PER_S for row in judged_rows)
        print(
            f"goal >= {GOAL_PAIRS_PER_S:,.0f} pairs/s at every process count ({worst['variant']}): "
            f"{'MET' if met else 'NOT MET'} - lowest {worst['rate']:,.0f}/s with {worst['processes']} "
            f"process{'es' if worst['processes'] > 1 else ''}, ratio to goal "
            f"{worst['rate'] / GOAL_PAIRS_PER_S:.2f}"
        )
        whatif = [row for row in rows if row["variant"] == "one-txn"]
        if whatif:
            low = min(whatif, key=lambda row: row["rate"])
            print(
                f"what-if one-txn (enqueue+first try_place in one transaction): lowest "
                f"{low['rate']:,.0f}/s ({low['processes']} process{'es' if low['processes'] > 1 else ''}), "
                f"ratio to goal "
                f"{low['rate'] / GOAL_PAIRS_PER_S:.2f}"
            )
        print("correctness: ledger empty after every run, every request placed and released once: yes")
        print()

        count = 600 if args.quick else 2000
        costs = _time_calls(directory, count, args.seed)
        pair = costs["enqueue"] + costs["try_place"] + costs["release"]
        print(f"breakdown, one process, {count} pairs (microseconds per call):")

        def line(label: str, value: float, note: str = "") -> None:
            print(f"  {label:<22}{value:>8.0f}   {note}".rstrip())

        for name in ("enqueue", "try_place", "release"):
            line(name, costs[name])
        line("= one pair", pair, f"({1e6 / pair:,.0f} pairs/s; nearly all of it runs under the one")
        print(f"{'':<35}write lock, so more processes cannot add much)")
        line("empty write txn", costs["empty_txn"], "(BEGIN IMMEDIATE; COMMIT; 3 per pair)")
        line("new connection + txn", costs["fresh_connection_txn"], "(connections are reused: not paid)")
        line("is_alive (psutil)", costs["is_alive"], "(per queued row ahead, per Waiting poll,")
        print(f"{'':<35}inside the write lock)")
        share = 3 * costs["empty_txn"] / pair
        print(f"  the bare sqlite transaction is {share:.0%} of a pair; the rest is statements and Python")
        print()
        from jupyter_gpushare.config import GPUShare

        interval = GPUShare().queue_poll_interval
        depths = [10, 50, 100] if args.quick else [10, 50, 100, 200]
        print(f"polling cost with a full pool: each waiting request calls try_place every {interval:g} s")
        print(f"  {'queued':>6} {'one round ms':>12} {'per poll us':>11} {'lock busy':>9}")
        for depth, seconds in _poll_cost(directory, depths):
            print(
                f"  {depth:>6} {1000 * seconds:>12.0f} {1e6 * seconds / depth:>11.0f} "
                f"{seconds / interval:>9.0%}"
            )
        print("  (lock busy: share of wall time the write lock is held by polling alone; a poll reads")
        print("   every row ahead of it and checks each one's process with psutil, so it grows as depth^2)")
        if args.profile or not met:
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
