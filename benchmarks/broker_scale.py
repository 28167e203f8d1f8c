"""The GPU broker at cluster scale, on Kubernetes' own control plane: 500 nodes, 2,000 kernel pods.

Method
------
The test cluster (``tests/cluster/``: kube-apiserver, kube-scheduler, kube-controller-manager
from Kubernetes' own code) is started by this script with an audit log of the Jupyter server's
ServiceAccount (the identity the broker acts as), counted as ``broker_cluster.py`` counts it.
Its nodes are of two kinds: a few simulated HAMi nodes whose kubelets run the pods the real
scheduler binds to them (enough vGPUs for the concurrent starts), and Node objects with the same
GPU resources and labels but no kubelet behind them, tainted so that nothing is placed there —
they are what the broker's list+watch of nodes carries, as a large cluster's are. Together: 500.

1. **Watches open.** Watch requests the API server saw from the broker from its start to the end.
2. **200 concurrent starts.** 200 kernel pod starts posted to the broker at the same instant (the
   pod runs ``sleep``; each caller then asks the broker how its start stands with long asks,
   as the provisioner does: each is answered when the start moves on, so a start costs a few
   answers, not one per poll interval): admission (``POST pods`` until the broker reports the
   pod created) p50 and p99; the time from the first start posted to the 200th pod running;
   non-watch API requests per start.
3. **Against a plain client** (``--against-plain``). The same number of starts by a plain client
   of the API server on the same control plane and nodes (``plain_starts`` in
   ``broker_cluster.py``): one thread per start creates the start's Secret and pod, built as the
   broker builds them, with the Kubernetes package's client and its connection pool sized as the
   broker's; one list+watch of the kernel pods tells each thread when its pod runs. Admission is
   there the time building and creating both took (an embedded server builds them too; so does
   the broker, inside the POST it times). After one unmeasured start on each side (a process's
   first API calls build the client's validators), the two sides alternate (``--repeat`` pairs,
   which side goes first alternating; each side's pods deleted and gone before the next), at 20
   and at 200 concurrent starts (``--quick``: 20), and the script prints per size the medians
   and the ratio broker / plain (the median of the pairs' ratios) of admission p50 and p99,
   first start -> last pod running, API requests per start (the audit log), and the CPU seconds
   of the control plane, of the broker process and of the callers (the plain client's threads;
   the broker's callers' threads). Nine pairs at 20 starts (their p99 is their slowest start,
   and one pair's ratio of it lands anywhere in x0.4-3.6 on 2 cores), three at 200. Each size
   is measured twice: with every process free to run on every CPU, then with the control plane
   on one half of the CPUs and the rest (this script, its callers, the plain client, the
   simulated kubelets, the broker) on the other — as in a cluster, whose API server does not run
   on the Jupyter server's machine — which tells what of a ratio is the two sides' share of
   CPUs the control plane also wants. Goals, one ``VERDICT`` line over every size and
   placement: admission p99 <= x1.2 and first start -> last pod running <= x1.1 of the plain
   client's.
4. **2,000 kernel pods.** The broker's RSS with no kernel, then with 2,000 kernel pods in the
   namespace, created for a scheduler the cluster does not run (they stay pending, as queued
   kernels do), once its watch shows them all; and how long ``GET pool`` and ``GET kernels`` take
   then.

Run: ``.venv/bin/python benchmarks/broker_scale.py [--against-plain]`` (needs the ``test`` and
``cluster`` extras and the control plane binary: ``make controlplane``); ``--quick`` runs 50 nodes,
20 concurrent starts and 200 kernel pods (CI size, well under a minute of its own; with
``--against-plain`` about a minute and a half).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from against import load_average
from broker_cluster import (
    NAMESPACE,
    AuditCounts,
    add_pending_pods,
    audited_plane,
    bench_id,
    broker_env,
    delete_plain,
    percentile,
    plain_starts,
    rss_mib,
    start_pods,
)

from jupyter_gpushare.backends.broker_client.transport import BrokerClient
from tests.cluster import KubeCluster, Namespace, hami_nodes
from tests.cluster.broker import start_broker
from tests.cluster.nodes import SimNode
from tests.cluster.rest import NODES

VGPUS_PER_NODE = 10  # what a simulated HAMi node advertises per card (one card each)
PHANTOM_TAINT = {"key": "gpushare.bench/no-kubelet", "value": "true", "effect": "NoSchedule"}


def phantom_nodes(count: int) -> list[dict[str, Any]]:
    """Node objects as HAMi nodes register, without a kubelet behind them, tainted so the
    scheduler places nothing there."""
    template = hami_nodes(1)[0]
    nodes = []
    for index in range(count):
        manifest = SimNode(f"idle-node-{index:04d}", template.allocatable, template.labels).manifest()
        manifest["spec"]["taints"] = [PHANTOM_TAINT]
        nodes.append(manifest)
    return nodes


@dataclass
class Half:
    """One side's run of ``starts`` concurrent starts: what it took and what it cost."""

    admitted: list[float]
    to_last_running: float
    requests_per_start: float
    breakdown: dict[str, int]
    cpu: dict[str, float]  # CPU seconds by whom: the control plane, the broker, the callers

    @property
    def p50(self) -> float:
        return statistics.median(self.admitted)

    @property
    def p99(self) -> float:
        return percentile(self.admitted, 0.99)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def measured(
    audit: AuditCounts, pids: dict[str, int], starts: int, run: Callable[[], tuple[list[float], float, float]]
) -> Half:
    """``run`` (the starts; it returns admission times, first start to last pod running, and its
    callers' CPU seconds) with the API requests the audit log saw and each process's CPU."""
    audit.clear()
    before = {who: cpu_seconds(pid) for who, pid in pids.items()}
    admitted, to_last, callers = run()
    cpu = {who: cpu_seconds(pid) - before[who] for who, pid in pids.items()}
    cpu["callers"] = callers
    counted = audit.counts()
    requests = sum(n for (verb, _), n in counted.items() if verb != "watch")
    breakdown = {f"{verb} {resource}": n for (verb, resource), n in sorted(counted.items())}
    return Half(admitted, to_last, requests / starts, breakdown, cpu)


@contextlib.contextmanager
def cores_apart(plane: int, ours: list[int]) -> Iterator[str]:
    """The control plane (process ``plane``) on one half of the CPUs this script may use, the
    processes ``ours`` (this script with its callers, plain client and simulated kubelets; the
    broker) on the other half, as a cluster's API server runs on machines of its own, not on the
    Jupyter server's; as they were after. Every thread of each is pinned; threads started
    meanwhile inherit their starter's CPUs (Go's too). Yields who runs where, in words."""
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "the control plane on CPUs of its own needs at least 2"
    theirs, mine = set(cpus[len(cpus) // 2 :]), set(cpus[: len(cpus) // 2])

    def pin(pid: int, cores: set[int]) -> None:
        for task in psutil.Process(pid).threads():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(task.id, cores)

    pin(plane, theirs)
    for pid in ours:
        pin(pid, mine)
    try:
        yield (
            f"the control plane on CPU {_cpus(theirs)}, the broker and the callers "
            f"(plain: the client) on CPU {_cpus(mine)}"
        )
    finally:
        for pid in (plane, *ours):
            pin(pid, set(cpus))


def _cpus(cores: set[int]) -> str:
    return ",".join(str(core) for core in sorted(cores))


def until_no_pods(cluster: KubeCluster) -> None:
    """Wait until the namespace has no pod left (a half's pods deleted, their vGPUs free)."""
    deadline = time.monotonic() + 300
    while pods := cluster.pods():
        assert time.monotonic() < deadline, f"{len(pods)} pods are still not gone"
        time.sleep(0.2)


def broker_starts(client: BrokerClient, starts: int, tag: str) -> tuple[list[float], float, float]:
    admitted, _, to_last, cpu = start_pods(client, starts, tag)
    return admitted, to_last, cpu


def client_starts(kubeconfig: str, starts: int, tag: str) -> tuple[list[float], float, float]:
    admitted, _, to_last, cpu = plain_starts(kubeconfig, starts, tag)
    return admitted, to_last, cpu


def half(
    side: str,
    cluster: KubeCluster,
    client: BrokerClient,
    audit: AuditCounts,
    pids: dict[str, int],
    starts: int,
    tag: str,
) -> Half:
    """One side's starts, measured; then its pods deleted and gone. What the simulated nodes
    saw that a real cluster would refuse fails the run, said (a pod whose status the API server
    refused never runs: without this, the run would only wait)."""
    kubeconfig = str(cluster.kubeconfig)
    try:
        if side == "plain":
            done = measured(audit, pids, starts, functools.partial(client_starts, kubeconfig, starts, tag))
            delete_plain(kubeconfig, starts, tag)
        else:
            done = measured(audit, pids, starts, functools.partial(broker_starts, client, starts, tag))
            for number in range(starts):
                client.call("DELETE", f"pods/{bench_id(f'{tag}-{number}')}?grace=0", {})
        until_no_pods(cluster)
    finally:
        if violations := cluster.violations:
            print(
                f"the simulated nodes saw {len(violations)} errors, the first: {violations[:3]}", flush=True
            )
    if violations:
        raise RuntimeError(f"{side} {tag}: the simulated nodes saw errors (above)")
    return done


def compare(
    cluster: KubeCluster,
    client: BrokerClient,
    audit: AuditCounts,
    pids: dict[str, int],
    starts: int,
    repeats: int,
) -> list[tuple[Half, Half]]:
    """``repeats`` pairs of halves at ``starts`` concurrent starts, the plain client's and the
    broker's, alternating which goes first; each half's pods are deleted before the next."""
    pairs: list[tuple[Half, Half]] = []
    for index in range(repeats):
        order = ("plain", "broker") if index % 2 == 0 else ("broker", "plain")
        load = load_average()
        halves = {
            side: half(side, cluster, client, audit, pids, starts, f"s{starts}r{index}") for side in order
        }
        plain_half, broker_side = halves["plain"], halves["broker"]
        pairs.append((plain_half, broker_side))
        print(
            f"  repeat {index + 1} ({' first, '.join(order)} second; load {load} -> {load_average()}): "
            f"admission p50/p99 plain {plain_half.p50:.2f}/{plain_half.p99:.2f} s, broker "
            f"{broker_side.p50:.2f}/{broker_side.p99:.2f} s (x{broker_side.p99 / plain_half.p99:.2f}); "
            f"to the last pod running plain {plain_half.to_last_running:.1f} s, broker "
            f"{broker_side.to_last_running:.1f} s "
            f"(x{broker_side.to_last_running / plain_half.to_last_running:.2f})",
            flush=True,
        )
    return pairs


# Pairs per size: a few starts' p99 is their slowest, one pair's ratio of it anywhere in x0.5-2
# on 2 cores, so the median needs more pairs there than at 200 starts, whose ratios vary less.
FEW_STARTS = 20
PAIRS_FEW = 9
PAIRS_MANY = 3
GOAL_P99 = 1.2  # the broker's admission p99 at most this times the plain client's
GOAL_TO_LAST = 1.1  # the same for the first start posted -> the last pod running


def report(starts: int, pairs: list[tuple[Half, Half]], placed: str, short: str) -> list[str]:
    """The table of one size's pairs (``placed``: on which CPUs who ran; ``short``, in the
    verdict); the goals' verdicts, as phrases."""

    def row(name: str, of: Callable[[Half], float], unit: str, goal: float | None = None) -> float:
        plain = statistics.median(of(pair[0]) for pair in pairs)
        broker = statistics.median(of(pair[1]) for pair in pairs)
        ratios = [of(b) / of(p) if of(p) else math.inf for p, b in pairs]
        ratio = statistics.median(ratios)
        each = " ".join(f"{value:.2f}" for value in ratios)
        target = f"<= {goal:.2f}" if goal is not None else "-"
        print(f"  {name:<44}{plain:>10.3g}{broker:>10.3g} {unit:<3}{ratio:>7.2f}  {target:<8}({each})")
        return ratio

    print(
        f"{starts} concurrent starts, plain client against the broker, {len(pairs)} pairs, {placed} "
        "(medians; ratio broker / plain: the median of the pairs' ratios, each pair's in brackets):"
    )
    print(f"  {'figure':<44}{'plain':>10}{'broker':>10}    {'ratio':>7}  goal")
    row("admission p50 (POST -> pod created)", lambda half: half.p50, "s")
    p99 = row("admission p99", lambda half: half.p99, "s", GOAL_P99)
    last = row(
        f"first start posted -> {starts}th pod running", lambda half: half.to_last_running, "s", GOAL_TO_LAST
    )
    row("API requests per start (watches apart)", lambda half: half.requests_per_start, "")
    row("CPU: the control plane", lambda half: half.cpu["control plane"], "s")
    row("CPU: the broker process", lambda half: half.cpu["broker"], "s")
    row("CPU: the callers (plain: the client itself)", lambda half: half.cpu["callers"], "s")
    print(f"  requests, last pair: plain {json.dumps(pairs[-1][0].breakdown)}")
    print(f"                       broker {json.dumps(pairs[-1][1].breakdown)}")
    goals = (("admission p99", p99, GOAL_P99), ("to the last pod running", last, GOAL_TO_LAST))
    return [
        f"{name} at {starts}, {short}, x{ratio:.2f} (<= {goal:.2f}): {'met' if ratio <= goal else 'MISSED'}"
        for name, ratio, goal in goals
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 50 nodes, 20 starts, 200 pods")
    parser.add_argument("--nodes", type=int, help="nodes in all (default 500; quick: 50)")
    parser.add_argument(
        "--starts",
        type=int,
        help="concurrent starts (default 200, with --against-plain 20 and 200; quick: 20)",
    )
    parser.add_argument("--kernels", type=int, help="kernel pods in all (default 2000; quick: 200)")
    parser.add_argument(
        "--against-plain",
        action="store_true",
        help="first the same concurrent starts by a plain client of the Kubernetes API, then through the "
        "broker, alternating, and the ratios",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help=f"with --against-plain: pairs per size and placement (default {PAIRS_FEW} at up to "
        f"{FEW_STARTS} starts, {PAIRS_MANY} above)",
    )
    arguments = parser.parse_args()
    if arguments.repeat is not None and arguments.repeat < 1:
        parser.error("--repeat must be at least 1")
    total_nodes = arguments.nodes or (50 if arguments.quick else 500)
    starts = arguments.starts or (20 if arguments.quick else 200)
    both = arguments.against_plain and not (arguments.quick or arguments.starts)
    sizes = sorted({20, starts}) if both else [starts]
    kernels = max(arguments.kernels or (200 if arguments.quick else 2000), starts)
    running_nodes = math.ceil(starts / VGPUS_PER_NODE)
    began = time.monotonic()
    print(f"load average at the start: {load_average()} ({os.cpu_count()} cores)")

    with tempfile.TemporaryDirectory(prefix="gpushare-broker-scale-") as directory:
        root = Path(directory)
        plane, audit = audited_plane(root)
        with (
            plane,
            KubeCluster(
                plane, Namespace(plane, NAMESPACE).create().name, root / "cluster", hami_nodes(running_nodes)
            ) as cluster,
        ):
            for manifest in phantom_nodes(max(0, total_nodes - running_nodes)):
                cluster.admin.create(NODES, manifest)
            env = broker_env(root, cluster.kubeconfig)
            (root / "config").mkdir()
            # No server asks after these kernels (a server would, every few seconds): the broker
            # must not collect them as orphans while they are measured.
            limits = {"GPUShareBroker": {"max_connections_per_user": 4 * starts, "orphan_grace": 3600}}
            (root / "config" / "jupyter_server_config.json").write_text(json.dumps(limits))
            audit.clear()
            broker_began = audit.offset  # the audit log from here on is the broker's
            broker, client = start_broker(root, env)
            assert plane.process is not None
            pids = {"control plane": plane.process.pid, "broker": broker.pid}
            try:
                nodes_seen = len(client.call("GET", "pool")["devices"])
                base = rss_mib(broker.pid)
                print(
                    f"cluster: {total_nodes} nodes ({running_nodes} with a simulated kubelet), "
                    f"the broker's pool shows {nodes_seen}; broker RSS {base:.0f} MiB"
                )
                if arguments.against_plain:
                    # One start on each side first, not measured: the first API calls of a
                    # process build the client's validators and import what a start needs
                    # (hundreds of ms in the broker), which no later start pays again.
                    for side in ("plain", "broker"):
                        half(side, cluster, client, audit, pids, 1, "warm-up")
                    verdicts = []
                    for size in sizes:
                        repeat = arguments.repeat or (PAIRS_FEW if size <= FEW_STARTS else PAIRS_MANY)
                        pairs = compare(cluster, client, audit, pids, size, repeat)
                        verdicts += report(size, pairs, "every process on every CPU", "CPUs shared")
                        # The same again with the control plane on CPUs of its own: what of the
                        # ratio above is the two sides' share of the CPUs the control plane also
                        # runs on (a cluster's API server does not run on the broker's machine).
                        if len(os.sched_getaffinity(0)) < 2:
                            print("one CPU: the control plane cannot run apart, not measured")
                            continue
                        with cores_apart(plane.process.pid, [os.getpid(), broker.pid]) as placed:
                            pairs = compare(cluster, client, audit, pids, size, repeat)
                        verdicts += report(size, pairs, placed, "control plane apart")
                    print("VERDICT the broker against a plain client: " + "; ".join(verdicts))
                else:
                    alone = measured(audit, pids, starts, lambda: broker_starts(client, starts, "scale"))
                    print(f"{starts} concurrent starts through the broker:")
                    print(
                        f"  admission (POST -> pod created): p50 {alone.p50 * 1000:.0f} ms, "
                        f"p99 {alone.p99 * 1000:.0f} ms"
                    )
                    print(f"  first start posted -> {starts}th pod running: {alone.to_last_running:.1f} s")
                    requests = f"{alone.requests_per_start:.2f} {json.dumps(alone.breakdown)}"
                    print(f"  API requests per start: {requests}")
                    for number in range(starts):
                        client.call("DELETE", f"pods/{bench_id(f'scale-{number}')}?grace=0", {})
                    until_no_pods(cluster)
                listing, took = add_pending_pods(cluster, client, kernels, kernels)
                after = rss_mib(broker.pid)
                print(
                    f"{len(listing)} kernel pods (pending): broker RSS {after:.0f} MiB "
                    f"(+{after - base:.0f} MiB, ratio {after / base:.2f} of its own); "
                    f"GET pool + kernels {took * 1000:.0f} ms"
                )
                # Every watch the broker opened, from its start (relists included) to now.
                audit.offset = broker_began
                print(f"watches the broker opened in all (relists included): {audit.watches()}")
            finally:
                broker.terminate()
                broker.wait(timeout=30)
    print(f"took {time.monotonic() - began:.0f} s in all; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
