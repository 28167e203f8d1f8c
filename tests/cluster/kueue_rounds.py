"""A scripted sequence of kernel pods against Kueue's quota, through a GPU broker, to measure the
broker's wait estimate for Kueue's queues against real waits (``benchmarks/kueue_wait.py``, and
``tests/integration/test_kueue_wait.py`` with shorter holds).

Rounds: two *holders* are started and run (each for its scripted hold: the benchmark deletes
its pod that long after Kueue admitted it), then a *waiter* (small) is started, which Kueue's
quota of ``QUOTA`` GPUs holds behind its gate until a holder ends. Warm-up rounds (three of two
large holders, one of two small ones) give the broker's accounting five finished holds of each
size, which it needs before it tells sizes apart; the measured rounds go through
:data:`PATTERN`. From the moment the broker tells a waiter's ``expected_start`` (``GET
pods/{id}``: its first estimate, the one kept to judge), the estimate is set against when Kueue
admitted the waiter (its start's words stop saying it is queued), next to the naive estimate made
at the same moment: its place in line (from Kueue, in the start's words) x the mean of the holds
finished by then / the quota's slots.

The broker (``jupyter gpushare broker --backend kubernetes`` on a Unix socket, NVIDIA's device
plugin preset, ``kueue_queue = "gpu"``) acts as the Jupyter server's ServiceAccount, granted the
shipped broker Role's Kueue rules (:func:`~tests.cluster.kueue.broker_grants`).
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_gpushare.backends.broker_client.transport import BrokerClient
from tests.cluster.broker import start_broker
from tests.cluster.fixture import KubeCluster
from tests.cluster.nodes import SimNode, gfd_labels

BIN = Path(sys.executable).parent
QUOTA = 2  # nvidia.com/gpu in the ClusterQueue: two kernel pods at once
DEADLINE = 120.0  # seconds any one pod may take to be admitted or go
POSITION = re.compile(r"position (\d+) of")
QUEUED = "queued by Kueue"

Kind = tuple[str, float]  # a kernel's size and its hold (seconds)


@dataclass(frozen=True)
class Script:
    """The kernels of a sequence: a small and a large one, with their holds."""

    small: Kind
    large: Kind

    @property
    def warm_up(self) -> list[tuple[Kind, Kind]]:
        return [(self.large, self.large)] * 3 + [(self.small, self.small)]

    @property
    def pattern(self) -> list[tuple[Kind, Kind]]:
        """The measured rounds' holders: where both are large the waiter waits long."""
        small, large = self.small, self.large
        return [(large, small), (large, large), (small, small), (small, large)]


@dataclass
class Kernel:
    name: str
    size: str
    hold: float
    kernel_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    posted: float = 0.0
    admitted: float | None = None  # by Kueue (or seen running)
    gated: bool = False  # seen behind Kueue's gate
    gone: float | None = None
    estimate: float | None = None  # the broker's first expected_start
    naive: float | None = None  # the naive estimate made at the same moment
    asked_at: float | None = None


@dataclass(frozen=True)
class Score:
    """The measured waiters' errors: the estimate's and the naive one's (seconds)."""

    waiters: int
    real: tuple[float, ...]  # each estimated waiter's wait from its first estimate
    errors: tuple[float, ...]
    naive_errors: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """The estimate's mean absolute error / the naive one's."""
        return statistics.mean(self.errors) / statistics.mean(self.naive_errors)

    @property
    def share(self) -> float:
        """The estimate's mean absolute error / the mean real wait."""
        return statistics.mean(self.errors) / statistics.mean(self.real)


def nodes() -> list[SimNode]:
    """Two nodes with four time-sliced shares of one card each: room for more than the quota."""
    labels = {**gfd_labels(replicas=4), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    return [SimNode(f"gpu-node-{n}", {"nvidia.com/gpu": "4"}, labels) for n in (1, 2)]


@contextlib.contextmanager
def broker(root: Path, cluster: KubeCluster, image: str) -> Iterator[BrokerClient]:
    """The GPU broker on a Unix socket in ``root`` (its log ``root/broker.log``), for the
    cluster's namespace, until the block ends."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")},
        "KUBECONFIG": str(cluster.kubeconfig),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_GPUSHARE_RESOURCE_PRESET": "nvidia",
        "JUPYTER_GPUSHARE_KUEUE_QUEUE": "gpu",
        "JUPYTER_GPUSHARE_KERNEL_IMAGE": image,
        "JUPYTER_GPUSHARE_NAMESPACE": cluster.namespace,
        "JUPYTER_GPUSHARE_ENCRYPT": "False",
    }
    process, client = start_broker(root, env)
    try:
        yield client
    finally:
        process.terminate()
        process.wait(30)


def first_estimates(log: Path) -> list[str]:
    """The broker's log lines of each waiting kernel's first estimate."""
    return [line.split("] ", 1)[-1] for line in log.read_text().splitlines() if "quota expected" in line]


def post(client: BrokerClient, kernel: Kernel) -> None:
    kernel.posted = time.time()
    body = {
        "kernel_id": kernel.kernel_id,
        "gpu_memory": kernel.size,
        "gpu_mode": "timeslice",
        "argv": ["sleep", "600"],
        "token": "t" * 32,
        "kernel_name": kernel.name,
    }
    client.call("POST", "pods", body)


def follow(client: BrokerClient, kernels: list[Kernel], finished: list[float]) -> None:
    """Look at every kernel of a round until all are gone: one admitted is deleted once its hold
    is over; a waiting one's first estimate is kept with the naive one of that moment."""
    deadline = time.monotonic() + DEADLINE * 2
    while any(kernel.gone is None for kernel in kernels):
        if time.monotonic() > deadline:
            raise RuntimeError(f"a round did not end: {kernels}")
        for kernel in kernels:
            if kernel.gone is not None:
                continue
            view = client.call("GET", f"pods/{kernel.kernel_id}")
            now = time.time()
            queued = QUEUED in str(view.get("detail") or "")
            kernel.gated = kernel.gated or queued
            if kernel.admitted is None and (view["state"] == "running" or (kernel.gated and not queued)):
                kernel.admitted = now
            elif view["state"] == "starting" and kernel.estimate is None and "expected_start" in view:
                place = POSITION.search(str(view.get("detail") or ""))
                if place is not None:  # else the next look has both
                    kernel.estimate, kernel.asked_at = float(view["expected_start"]), now
                    kernel.naive = now + int(place.group(1)) * statistics.mean(finished) / QUOTA
            if kernel.admitted is not None and now - kernel.admitted >= kernel.hold:
                client.call("DELETE", f"pods/{kernel.kernel_id}?grace=0", {})
                kernel.gone = now
                finished.append(now - kernel.admitted)
        time.sleep(0.1)


def admitted(client: BrokerClient, kernel: Kernel) -> None:
    """Wait until a holder runs (the quota had room for it)."""
    deadline = time.monotonic() + DEADLINE
    while client.call("GET", f"pods/{kernel.kernel_id}")["state"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kernel.name} not running after {DEADLINE:g} s")
        time.sleep(0.1)
    kernel.admitted = time.time()


def play(client: BrokerClient, script: Script, rounds: int, say: Callable[[str], None]) -> list[Kernel]:
    """The warm-up, then ``rounds`` rounds of the pattern; the measured rounds' waiters."""
    finished: list[float] = []
    measured: list[Kernel] = []
    pattern = script.pattern
    rounds_played = [*script.warm_up, *(pattern[number % len(pattern)] for number in range(rounds))]
    for number, pair in enumerate(rounds_played):
        holders = [
            Kernel(f"round{number}-holder{index}", size, hold) for index, (size, hold) in enumerate(pair)
        ]
        for holder in holders:
            post(client, holder)
        for holder in holders:
            admitted(client, holder)
        waiter = Kernel(f"round{number}-waiter", *script.small)
        post(client, waiter)
        follow(client, [*holders, waiter], finished)
        if number >= len(script.warm_up):
            measured.append(waiter)
        said = "no estimate"
        if waiter.estimate is not None and waiter.naive is not None and waiter.asked_at is not None:
            estimated, naive = waiter.estimate - waiter.asked_at, waiter.naive - waiter.asked_at
            said = f"estimated {estimated:.1f} s, naive {naive:.1f} s"
        held = ", ".join(f"{h.size} {h.hold:g} s" for h in holders)
        waited = (waiter.admitted or waiter.posted) - waiter.posted
        say(f"round {number + 1}: holders {held}; the waiter waited {waited:.1f} s, {said}")
    return measured


def score(measured: Sequence[Kernel]) -> Score:
    estimated = [
        (k.admitted, k.estimate, k.naive, k.asked_at)
        for k in measured
        if k.admitted is not None
        and k.estimate is not None
        and k.naive is not None
        and k.asked_at is not None
    ]
    return Score(
        len(measured),
        tuple(admitted - asked for admitted, _, _, asked in estimated),
        tuple(abs(estimate - admitted) for admitted, estimate, _, _ in estimated),
        tuple(abs(naive - admitted) for admitted, _, naive, _ in estimated),
    )


__all__ = ["QUOTA", "Kernel", "Score", "Script", "broker", "first_estimates", "nodes", "play", "score"]
