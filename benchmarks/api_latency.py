"""REST latency of ``GET pool`` / ``GET kernels`` under 20 clients, the stream's cost, and one snapshot.

Method
------
A real ``jupyter server`` process (this environment's ``jupyter-server``, with the gpushare
extension enabled the way an installed package enables it) runs in a fresh temporary directory
with its own ``JUPYTER_CONFIG_DIR``, ``JUPYTER_DATA_DIR``, ``JUPYTER_RUNTIME_DIR`` and
``JUPYTER_PATH``, a simulated ``4xA100-80GB`` pool (``JUPYTER_GPUSHARE_SIMULATE``) and a private
ledger (``JUPYTER_GPUSHARE_LEDGER_PATH``). Once it answers ``GET /api/status``, this script
writes N running slices (100, then 1,000; 100 only with ``--quick``) straight into that ledger
through :class:`jupyter_gpushare.backends.local.ledger.Ledger` (``enqueue`` then ``try_place``, each with a
declared usage), all held by a ``sleep`` process this script starts (so no reconciliation drops
them) and all carrying the server's own ``server_id`` (``{owner}@{hostname}:{server pid}``), so
``GET kernels`` lists N entries and ``GET pool`` shows N reservations. Both are checked before
anything is timed.

Latency (:mod:`http_load`): 20 closed-loop clients on loopback, one kept-alive connection each,
5 warm-up requests each and then, released together, 100 timed requests each (20 with
``--quick``) to one route. The baseline is jupyter_server's own ``GET /api/status`` -
authenticated and authorized like our routes, with a trivial body - measured the same way in
the same run. The routes take turns over three rounds, their order turned by one each round
(status, pool, kernels; pool, kernels, status; kernels, status, pool), so that a drift in
machine load hits them alike and no route's place in the order is better than another's. The
whole latency part runs ``--repeat`` times (3; 1 with ``--quick``) and the goal is judged on the
median of the repeats' ratios: one p99 of 2,000 requests is the 20th slowest, which one stall of
the machine can move by half. Reported per
route: p50, p90, p99, max, requests/s, and the server process's CPU time per request (over the
measured phase only; it does not depend on how many clients queue behind each other and is the
steadiest figure on a busy machine); then the same with one client, and a Little's-law line
(with N closed-loop clients and one event loop, a request waits for about N requests' worth of
server work).

Stream fan-out: three windows of the same length (10 s; 5 s with ``--quick``) with 0, 1 and 20
subscribers to ``GET /api/gpushare/stream``: the server's CPU over each window as a share of one
core, events per subscriber, the payload size, and the spread between the first and the last
subscriber receiving the same event.

One snapshot, in this process on the same ledger (always, so that this part cannot rot): what
building the snapshot costs after a change - the ledger read once, pool and kernels views, JSON,
bytes and ETag, all that ``GET pool``, ``GET kernels`` and the stream then answer from until the
next change - in one thread, then the same through the event loop, a stream tick (a sampling
round, then the snapshot) after a change and without one; the parts (``Ledger.state``, ``pool``,
``server_kernels``, a bare ``fetchall`` of the rows as the floor), and a cProfile of the build.
Costs are medians of the process's CPU time (wall time beside it).

Goals (issues 24 and 40), each printed as a verdict:

* ``GET pool`` and ``GET kernels`` with 100 slices, and again with 1,000, under 20 clients: p99
  and server CPU per request <= x1.10 those of ``GET /api/status`` in the same run (any other
  slice count: reported only);
* one snapshot built after a change <= 2 ms (CPU) with 100 slices.

``--against REV`` starts a second server whose package is that of git revision REV (a worktree
under ``build/``, see :mod:`against`), fills its ledger with that revision's code, and runs every
measurement on both servers, interleaved, printing the ratios ours / REV.

Everything is bounded: every wait has a deadline, and the servers and the ``sleep`` process are
stopped in ``finally``.

Run: ``.venv/bin/python benchmarks/api_latency.py`` (about 2 minutes on 2 cores; ``--quick``
under a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import cProfile
import importlib
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from against import Revision, RevisionError, checkout, child_env, import_package_from
from http_load import CLIENTS, Phase, Summary, load, merge, percentile, print_latency_table, summarise

GOAL_RATIO = 1.10  # p99 and server CPU per request, to GET /api/status's
GOAL_SNAPSHOT_MS = 2.0
GOAL_SLICES = (100, 1000)  # the slice counts the latency goal is judged at
SNAPSHOT_SLICES = 100  # the snapshot goal's
POOL = "4xA100-80GB"
POOL_BYTES = 4 * 80 * 2**30
OWNER = "bench-user"
SIZES = ("2G", "3G", "4G")
MODE = "timeslice"
ROUNDS = 3  # one per route: each route takes each place in the order once (see latency_runs)
SERVER_START_LIMIT = 90.0  # seconds
BASELINE = ("baseline GET /api/status", "/api/status")
ROUTES = (
    BASELINE,
    ("GET /api/gpushare/pool", "/api/gpushare/pool"),
    ("GET /api/gpushare/kernels", "/api/gpushare/kernels"),
)
BIN = Path(sys.executable).parent


# ---- the server ----------------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    token: str
    log_path: Path
    root: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    @property
    def server_id(self) -> str:
        # What LocalBackend computes in the server process (service.server_id).
        return f"{OWNER}@{socket.gethostname()}:{self.process.pid}"

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user + times.system)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        path = root / name.lower()
        path.mkdir()
        env[name] = str(path)
    env["JUPYTER_PATH"] = str(root / "share" / "jupyter")
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["JUPYTER_GPUSHARE_SIMULATE"] = POOL
    env["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(root / "ledger.sqlite")
    env["JUPYTER_GPUSHARE_OWNER"] = OWNER
    env.pop("JUPYTERHUB_USER", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_server(root: Path, env: dict[str, str]) -> Server:
    port = free_port()
    token = f"bench-{os.getpid()}"
    serve_root = root / "serve"
    serve_root.mkdir()
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(BIN / "jupyter-server"),
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                "--ServerApp.open_browser=False",
                "--ServerApp.allow_root=True",
                f"--ServerApp.root_dir={serve_root}",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Server(process, f"http://127.0.0.1:{port}", token, log_path, serve_root)
    deadline = time.monotonic() + SERVER_START_LIMIT
    with httpx.Client(headers=server.headers, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {process.returncode}:\n{server.log_tail()}")
            try:
                if client.get(f"{server.url}/api/status").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"jupyter server did not answer in {SERVER_START_LIMIT:.0f} s:\n{server.log_tail()}")


# ---- the ledger's slices -------------------------------------------------------------------


def sizes_for(count: int) -> tuple[str, ...]:
    """Slice sizes that fit ``count`` slices on the pool: 2G/3G/4G up to 100, smaller beyond."""
    if count * 3 * 2**30 <= 0.95 * POOL_BYTES:
        return SIZES
    mean = int(0.75 * POOL_BYTES / count) // 2**20  # MiB
    return tuple(f"{mean * share // 4}M" for share in (3, 4, 5))


def _api() -> Any:
    """The package's names the fill uses, wherever the measured commit keeps them (the request
    and outcome types lived in the ledger module before commit 2c944eb)."""
    try:
        return importlib.import_module("jupyter_gpushare.core.records")
    except ImportError:
        return importlib.import_module("jupyter_gpushare.backends.local.ledger")


def fill_ledger(ledger_path: Path, server_id: str, holder_pid: int, count: int, seed: int) -> int:
    """Exactly ``count`` running slices held by ``holder_pid`` (any earlier ones are released
    first); returns the bytes reserved. Runs with the package of the side being measured."""
    from jupyter_gpushare.backends.local.inventory import parse_simulation
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.backends.processes import identify
    from jupyter_gpushare.core.modes import get_mode
    from jupyter_gpushare.core.placement.allocator import Policy

    types = _api()
    holder = identify(holder_pid)
    if holder is None:
        raise RuntimeError(f"the holder process {holder_pid} is gone")
    rng = random.Random(seed)
    sizes = sizes_for(count)
    ledger = Ledger(ledger_path)
    ledger.register_devices(parse_simulation(POOL).devices, True)
    placement = get_mode(MODE).placement
    reserved = 0
    try:
        for record in ledger.records():
            ledger.release(record.kernel_id)
        for index in range(count):
            kernel_id = f"bench-{index:04d}-{rng.getrandbits(48):012x}"
            ledger.enqueue(
                types.NewRequest(
                    kernel_id=kernel_id,
                    owner=OWNER,
                    server_id=server_id,
                    mode=MODE,
                    placement=placement,
                    size=sizes[index % len(sizes)],
                    cores=None,
                    holder=holder,
                    kernel_name="python3-gpu-4g",
                    path=f"projects/run-{index:04d}/analysis.ipynb",
                )
            )
            outcome = ledger.try_place(kernel_id, Policy())
            if not isinstance(outcome, types.Placed):
                raise RuntimeError(f"slice {index} ({sizes[index % len(sizes)]}) was not placed: {outcome}")
            used = int(outcome.record.memory * rng.uniform(0.1, 0.9))
            ledger.report_usage(kernel_id, used, rng.randrange(0, 60), "simulated")
            reserved += outcome.record.memory
    finally:
        ledger.close()
    return reserved


def check_views(server: Server, count: int, reserved: int) -> tuple[int, int, int]:
    """Both routes answer with the slices; returns their body sizes, and the kernels' as sent to
    a client that accepts gzip (httpx asks for it, as a browser does)."""
    with httpx.Client(headers=server.headers, timeout=30.0) as client:
        pool = client.get(f"{server.url}/api/gpushare/pool")
        kernels = client.get(f"{server.url}/api/gpushare/kernels")
    if pool.status_code != 200 or kernels.status_code != 200:
        raise RuntimeError(
            f"GET pool {pool.status_code}, GET kernels {kernels.status_code}:\n{server.log_tail()}"
        )
    devices = pool.json()["devices"]
    shown = sum(device["memory_reserved"] for device in devices)
    listed = kernels.json()
    running = [entry for entry in listed if entry["state"] == "running" and entry["kernel_id"]]
    if len(devices) != 4 or shown != reserved:
        raise RuntimeError(
            f"GET pool shows {len(devices)} devices, {shown} bytes reserved; expected 4, {reserved}"
        )
    if len(running) != count:
        raise RuntimeError(
            f"GET kernels lists {len(running)} running slices of this server; expected {count}"
        )
    return len(pool.content), len(kernels.content), kernels.num_bytes_downloaded


# ---- the two sides: this checkout's package, and --against REV's -------------------------------


@dataclass
class Side:
    """The code one server runs: this checkout's package (``revision`` None), or a commit's."""

    label: str
    root: Path
    revision: Revision | None = None
    server: Server | None = None

    def fill(self, holder_pid: int, count: int, seed: int) -> int:
        assert self.server is not None
        arguments = (self.root / "ledger.sqlite", self.server.server_id, holder_pid, count, seed)
        if self.revision is None:
            return fill_ledger(*arguments)
        # The commit's code writes the commit's ledger: in a fresh process that imports it.
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=1,
            mp_context=mp.get_context("spawn"),
            initializer=import_package_from,
            initargs=(str(self.revision.root),),
        ) as pool:
            return pool.submit(fill_ledger, *arguments).result()


def start_sides(base: Path, revision: Revision | None) -> list[Side]:
    sides = [Side("ours", base / "ours")]
    if revision is not None:
        sides.append(Side(revision.short, base / revision.short, revision))
    for side in sides:
        side.root.mkdir()
        side.server = start_server(side.root, child_env(side.revision, environment(side.root)))
    return sides


# ---- latency ---------------------------------------------------------------------------------


async def latency_runs(
    sides: list[Side], clients: int, per_client: int, kind: str
) -> tuple[dict[str, list[Summary]], dict[str, list[Summary]]]:
    """Per side: each route under ``clients`` clients, then with one client.

    The order of the routes turns by one each round (``ROUNDS`` is the number of routes): every
    route is first, second and last once, and no route's phases follow each other. When the
    rounds only reversed the order, the last route ran twice back to back in the middle of each
    repeat, and on a shared machine that place had the worse p99 whichever route took it
    (2026-12-06: ``GET kernels``' median above ``GET pool``'s in 8 of 10 runs, ``GET pool``'s
    above ``GET kernels``' in 3 of 4 with the two swapped). Every side's phases of one route
    run next to each other."""
    per_round = [per_client // ROUNDS + (1 if index < per_client % ROUNDS else 0) for index in range(ROUNDS)]
    plan = [(side, route) for route in ROUTES for side in sides]
    phases: dict[tuple[str, str], list[Phase]] = {(side.label, label): [] for side, (label, _) in plan}
    for round_index, requests in enumerate(per_round):
        turn = round_index * len(sides) % len(plan)
        for side, (label, path) in plan[turn:] + plan[:turn]:
            assert side.server is not None
            phases[side.label, label].append(await load(side.server, path, clients, requests, kind))
    loaded = {
        side.label: [summarise(label, merge(phases[side.label, label])) for label, _ in ROUTES]
        for side in sides
    }
    single: dict[str, list[Summary]] = {side.label: [] for side in sides}
    for side, (label, path) in plan:
        assert side.server is not None
        single[side.label].append(summarise(label, await load(side.server, path, 1, per_client, kind)))
    return loaded, single


def print_ratios(label: str, rows: list[Summary], clients: int) -> None:
    base = rows[0]
    print(f"ratio to the baseline ({label}, {clients} clients):")
    for row in rows[1:]:
        print(
            f"  {row.label:<28} p50 x{row.p50 / base.p50:.2f}   p99 x{row.p99 / base.p99:.2f}   "
            f"server CPU/request x{row.server_ms / base.server_ms:.2f}"
        )


def print_little(rows: list[Summary], clients: int) -> None:
    print(f"queueing: with {clients} closed-loop clients a one-loop server answers each request after about")
    print(f"{clients} x its cost (Little's law):")
    for row in rows:
        print(
            f"  {row.label:<28} {clients} x {row.server_ms:.2f} ms server CPU = "
            f"{clients * row.server_ms:.1f} ms; measured mean {1000 * clients / row.rate:.1f} ms"
        )


def goal_ratios(rows: list[Summary]) -> dict[str, float]:
    """Each of our routes' p99 and server CPU per request over the baseline's (``rows[0]``)."""
    base = rows[0]
    return {
        f"{row.label} {name}": ours / theirs
        for row in rows[1:]
        for name, ours, theirs in (("p99", row.p99, base.p99), ("CPU/request", row.server_ms, base.server_ms))
    }


def latency_verdict(repeats: list[list[Summary]], slices: int) -> bool:
    """The goal: each of our routes' p99 and server CPU per request <= GOAL_RATIO x the baseline's,
    judged on the median over the repeats. One p99 of 2,000 requests is the 20th slowest, and on
    two shared cores the baseline's own p99 moved between 11.0 and 18.3 ms from one run to the
    next (2026-12-05): a single run's ratio says whether a stall fell into a route's rounds."""
    each = [goal_ratios(rows) for rows in repeats]
    medians = {name: statistics.median(ratios[name] for ratios in each) for name in each[0]}
    misses = [f"{name} x{ratio:.2f}" for name, ratio in medians.items() if ratio > GOAL_RATIO]
    if len(repeats) > 1:
        print(f"worst ratio of each repeat: {', '.join(f'x{max(ratios.values()):.2f}' for ratios in each)}")
    print(
        f"VERDICT: GET pool and GET kernels with {slices} slices: p99 and server CPU per request <= "
        f"x{GOAL_RATIO:.2f} of GET /api/status (median of {len(repeats)} repeat"
        f"{'s' if len(repeats) > 1 else ''}): {'MET' if not misses else 'MISSED'} "
        f"(worst x{max(medians.values()):.2f}" + (f"; over: {', '.join(misses)})" if misses else ")")
    )
    return not misses


def print_against(ours: list[Summary], theirs: list[Summary], label: str) -> None:
    print(f"ours / {label} (same run, interleaved):")
    for mine, other in zip(ours, theirs, strict=True):
        print(
            f"  {mine.label:<28} p50 x{mine.p50 / other.p50:.2f}   p99 x{mine.p99 / other.p99:.2f}   "
            f"server CPU/request x{mine.server_ms / other.server_ms:.2f}"
        )


# ---- stream fan-out --------------------------------------------------------------------------


@dataclass
class StreamWindow:
    subscribers: int
    seconds: float
    server_cpu: float
    events: list[int]
    payload: int  # bytes of one event's data
    spreads: list[float]  # seconds between first and last receipt of one event


async def stream_window(server: Server, subscribers: int, seconds: float) -> StreamWindow:
    url = f"{server.url}/api/gpushare/stream"
    measuring = False
    counts = [0] * subscribers
    first = [asyncio.Event() for _ in range(subscribers)]
    receipts: dict[int, list[float]] = {}
    payload = 0

    async def subscriber(index: int) -> None:
        nonlocal payload
        timeout = httpx.Timeout(connect=10.0, read=30.0, write=10.0, pool=10.0)
        async with (
            httpx.AsyncClient(headers=server.headers, timeout=timeout) as client,
            client.stream("GET", url) as reply,
        ):
            if reply.status_code != 200:
                raise RuntimeError(f"stream answered {reply.status_code}")
            sequence = -1
            async for line in reply.aiter_lines():
                if line.startswith("id: "):
                    sequence = int(line[4:])
                elif line.startswith("data: "):
                    now = time.perf_counter()
                    first[index].set()
                    if measuring:
                        counts[index] += 1
                        payload = len(line) - 6
                        receipts.setdefault(sequence, []).append(now)

    tasks = [asyncio.ensure_future(subscriber(index)) for index in range(subscribers)]
    try:
        if tasks:
            waiters = [asyncio.ensure_future(event.wait()) for event in first]
            done, _ = await asyncio.wait(waiters, timeout=20)
            for waiter in waiters:
                waiter.cancel()
            failed = [task for task in tasks if task.done()]
            if len(done) < subscribers or failed:
                for task in failed:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                raise RuntimeError(f"only {len(done)} of {subscribers} subscribers got an event in 20 s")
            await asyncio.sleep(0.5)  # past the replayed latest snapshot
        cpu_before = server.cpu_seconds()
        started = time.perf_counter()
        measuring = True
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - started
        cpu = server.cpu_seconds() - cpu_before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    spreads = [max(times) - min(times) for times in receipts.values() if len(times) == subscribers > 1]
    return StreamWindow(subscribers, elapsed, cpu, counts, payload, spreads)


async def stream_runs(servers: list[Server], subscribers: int, seconds: float) -> list[list[StreamWindow]]:
    """0, 1 and ``subscribers`` subscribers, each count on every server in turn."""
    windows: list[list[StreamWindow]] = [[] for _ in servers]
    for count in (0, 1, subscribers):
        for index, server in enumerate(servers):
            windows[index].append(await stream_window(server, count, seconds))
            # Let the hub notice it has no subscriber left (it checks once per sample_interval).
            await asyncio.sleep(2.5)
    return windows


def print_stream_table(windows: list[StreamWindow]) -> None:
    idle = windows[0]
    idle_share = idle.server_cpu / idle.seconds
    print(
        f"  {'subscribers':>11}{'server CPU':>12}{'over idle':>11}{'events/sub':>15}"
        f"{'CPU ms/event':>14}{'payload':>10}{'spread p50 ms':>15}{'spread max ms':>15}"
    )
    for window in windows:
        share = window.server_cpu / window.seconds
        events = (sum(window.events) / len(window.events)) if window.events else 0.0
        extra = share - idle_share
        # Server CPU above idle per snapshot sent (to every subscriber at once).
        per_event = f"{1000 * extra * window.seconds / events:.2f}" if events else "-"
        spread50 = f"{1000 * percentile(window.spreads, 0.5):.2f}" if window.spreads else "-"
        spread_max = f"{1000 * max(window.spreads):.2f}" if window.spreads else "-"
        events_text = (
            f"{events:.1f}"
            + (f" ({min(window.events)}-{max(window.events)})" if len(window.events) > 1 else "")
            if window.events
            else "-"
        )
        payload = f"{window.payload / 1024:.1f} KiB" if window.payload else "-"
        print(
            f"  {window.subscribers:>11}{100 * share:>11.1f}%{100 * extra:>+10.1f}%{events_text:>15}"
            f"{per_event:>14}{payload:>10}{spread50:>15}{spread_max:>15}"
        )
    tick = 1 / os.sysconf("SC_CLK_TCK")
    print(
        f"  (process CPU times move in steps of {1000 * tick:.0f} ms: about "
        f"{100 * tick / idle.seconds:.1f}% of a core per window; the spread is seen by this process's "
        f"subscribers, their own parsing included)"
    )


# ---- one snapshot, in this process --------------------------------------------------------------


class _NoKernels:
    """Enough of a kernel manager for ``GPUShareContext`` (no kernel started here)."""

    default_kernel_name = ""

    def list_kernel_ids(self) -> list[str]:
        return []

    def get_kernel(self, kernel_id: str) -> Any:
        raise KeyError(kernel_id)


@dataclass
class Cost:
    """Medians over repeated calls: wall time, and this process's CPU time (all threads)."""

    wall_ms: float
    cpu_ms: float

    def __str__(self) -> str:
        return f"{self.cpu_ms:>8.3f} ms CPU {self.wall_ms:>8.3f} ms wall"


def _cost(step: Callable[[], Any], calls: int, before: Callable[[], Any] | None = None) -> Cost:
    """Median cost of ``step`` over ``calls`` calls; ``before`` runs untimed before each."""
    walls, cpus = [], []
    for _ in range(calls):
        if before is not None:
            before()
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return Cost(1000 * statistics.median(walls), 1000 * statistics.median(cpus))


def snapshot_costs(ledger_path: Path, server_id: str, calls: int) -> Cost:
    """What one snapshot and one stream tick cost in this process on the same ledger; returns
    the cost of a snapshot after a change (the goal's figure)."""
    from jupyter_gpushare.backends.local import LocalBackend
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.server.context import GPUShareContext

    service = LocalBackend(GPUShare(simulate=POOL, ledger_path=str(ledger_path), owner=OWNER))
    service.server_id = server_id  # list the server's slices, as the server does
    context = GPUShareContext(backend=service, kernel_manager=_NoKernels(), kernel_spec_manager=None)
    ledger = service.ledger
    first = ledger.records()[0]
    usage = [first.memory_used or 0]

    def change() -> None:
        # A kernel's declared usage moves by one byte: every reader sees a new ledger.
        usage[0] += 1 if usage[0] % 2 == 0 else -1
        ledger.report_usage(first.kernel_id, usage[0], first.utilization, "simulated")

    loop = asyncio.new_event_loop()

    def run(coroutine: Callable[[], Awaitable[Any]]) -> Callable[[], Any]:
        return lambda: loop.run_until_complete(coroutine())

    plain = sqlite3.connect(ledger_path)
    try:
        run(context.stream_event)()
        snapshot = _cost(context.snapshots.build, calls, before=change)
        steps: list[tuple[str, Callable[[], Any], bool]] = [
            ("  the same through the event loop", run(context.snapshots.current), True),
            ("stream tick after a change", run(context.stream_event), True),
            ("stream tick, no change", run(context.stream_event), False),
            ("  sampling round (refresh)", service.refresh, True),
            ("  snapshot, no change", run(context.snapshots.current), False),
            (f"  Ledger.state() ({len(ledger.records())} rows)", ledger.state, True),
            ("  service.pool()", service.pool, False),
            ("  context.server_kernels()", context.server_kernels, False),
            ("  json.dumps(server_kernels())", lambda: json.dumps(context.server_kernels()), False),
            (
                "  floor: fetchall() of the rows",
                lambda: plain.execute("SELECT * FROM slices").fetchall(),
                False,
            ),
            ("Ledger.records()", ledger.records, False),
        ]
        print(f"one snapshot in this process, medians of {calls} calls (CPU: all of this process's threads):")
        print(f"  {'snapshot after a change (the goal)':<38}{snapshot}")
        print("    (read the ledger, build the pool and the kernels, JSON, ETag: what one change costs")
        print("     once, whatever the number of requests and subscribers)")
        for label, step, after_change in steps:
            step()
            print(f"  {label:<38}{_cost(step, calls, before=change if after_change else None)}")
        print("  (a tick: a sampling round for fresh device figures, then the snapshot; after a change")
        print("   the round's own write is a second change, so the snapshot reads the ledger again)")
        profiler = cProfile.Profile()
        for _ in range(calls):
            change()
            profiler.runcall(context.snapshots.build)
    finally:
        plain.close()
        loop.close()
        ledger.close()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    print(f"  cProfile of {calls} snapshot builds after a change (pool, kernels, JSON), by own time:")
    started = False
    for line in text.getvalue().splitlines():
        started = started or line.strip().startswith("ncalls")
        if started and line.strip():
            print(f"    {line.rstrip()}")
    return snapshot


# ---- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100, help="timed requests per client per route")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument(
        "--repeat", type=int, default=3, help="latency runs per slice count, judged on their median"
    )
    parser.add_argument(
        "--slices", default=None, help="comma-separated slice counts (default 100,1000; --quick: 100)"
    )
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per stream window")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--client", choices=sorted(CLIENTS), default="raw", help="HTTP client of the latency runs"
    )
    parser.add_argument(
        "--quick", action="store_true", help="100 slices, one repeat, 20 requests per client, 5 s windows"
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run every measurement on a server with the package of git revision REV",
    )
    args = parser.parse_args()
    if args.quick:
        args.requests = min(args.requests, 20)
        args.repeat = 1
        args.window = min(args.window, 5.0)
    try:
        counts = [int(item) for item in (args.slices or ("100" if args.quick else "100,1000")).split(",")]
    except ValueError:
        parser.error(f"--slices takes whole numbers separated by commas, not {args.slices!r}")
    too_few = min(args.clients, args.subscribers, args.repeat, *counts) < 1
    if args.requests < ROUNDS or too_few or args.window <= 0:
        parser.error(f"--requests >= {ROUNDS}; --clients, --repeat, --slices, --subscribers, --window > 0")
    try:
        with contextlib.ExitStack() as stack:
            revision = stack.enter_context(checkout(args.against)) if args.against else None
            return run(args, counts, revision)
    except RevisionError as error:
        print(f"api_latency: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, counts: list[int], revision: Revision | None) -> int:
    print(
        f"API latency: {', '.join(map(str, counts))} running slices on a simulated {POOL}, "
        f"{args.clients} clients on loopback, {args.requests} timed requests per client per route; "
        f"stream windows of {args.window:.0f} s"
    )
    print(
        f"python {platform.python_version()}, httpx {httpx.__version__}, {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{value:.2f}' for value in os.getloadavg())}"
    )
    if revision is not None:
        print(f"against {revision.label} (commit {revision.short}): a second server runs its package")
    base = Path(tempfile.mkdtemp(prefix="gpushare-api-bench-"))
    holder = subprocess.Popen(["sleep", "900"], stdin=subprocess.DEVNULL)
    sides: list[Side] = []
    try:
        sides = start_sides(base, revision)
        servers = [side.server for side in sides if side.server is not None]
        for count in counts:
            print()
            print(f"===== {count} slices =====")
            for side in sides:
                assert side.server is not None
                started = time.perf_counter()
                reserved = side.fill(holder.pid, count, args.seed)
                pool_bytes, kernels_bytes, sent = check_views(side.server, count, reserved)
                print(
                    f"{side.label}: ledger filled in {time.perf_counter() - started:.1f} s, "
                    f"{reserved / 2**30:.0f} GiB reserved; GET pool {pool_bytes / 1024:.1f} KiB, "
                    f"GET kernels {kernels_bytes / 1024:.1f} KiB ({sent / 1024:.1f} KiB as sent with gzip)"
                )
            repeats = []
            for repeat in range(args.repeat):
                loaded, single = asyncio.run(latency_runs(sides, args.clients, args.requests, args.client))
                repeats.append(loaded["ours"])
                for side in sides:
                    print()
                    print_latency_table(
                        f"{side.label}: {args.clients} concurrent clients ({args.client} client, closed "
                        f"loop, {ROUNDS} rounds in turning order), repeat {repeat + 1} of {args.repeat}:",
                        loaded[side.label],
                    )
                    print_latency_table(f"{side.label}: 1 client (no queueing):", single[side.label])
                    print_ratios(side.label, loaded[side.label], args.clients)
                print()
                print_little(loaded["ours"], args.clients)
                if revision is not None:
                    print_against(loaded["ours"], loaded[revision.short], revision.short)
            print()
            if count in GOAL_SLICES:
                latency_verdict(repeats, count)
            else:
                print(f"(with {count} slices: reported, no goal)")

        print()
        print(f"stream fan-out ({args.window:.0f} s per window, sample_interval 1 s):")
        windows = asyncio.run(stream_runs(servers, args.subscribers, args.window))
        for side, side_windows in zip(sides, windows, strict=True):
            print(f"{side.label}:")
            print_stream_table(side_windows)
        for server in servers:
            if server.process.poll() is not None:
                raise RuntimeError(f"a server died during the run:\n{server.log_tail()}")

        print()
        ours = sides[0]
        assert ours.server is not None
        if counts[-1] != SNAPSHOT_SLICES:
            ours.fill(holder.pid, SNAPSHOT_SLICES, args.seed)
        cost = snapshot_costs(ours.root / "ledger.sqlite", ours.server.server_id, 50 if args.quick else 200)
        print(
            f"VERDICT: one snapshot (pool + kernels, rendered) after a change with {SNAPSHOT_SLICES} slices "
            f"<= {GOAL_SNAPSHOT_MS:g} ms: {'MET' if cost.cpu_ms <= GOAL_SNAPSHOT_MS else 'MISSED'} "
            f"({cost.cpu_ms:.2f} ms CPU, {cost.wall_ms:.2f} ms wall)"
        )
        print(f"load average at the end: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
        return 0
    finally:
        for side in sides:
            if side.server is not None:
                side.server.stop()
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
