"""Kernel start-to-ready latency on the local backend: embedded ledger vs through a GPU broker.

Method
------
One isolated Jupyter environment (temporary ``JUPYTER_PATH``, ``JUPYTER_DATA_DIR``,
``JUPYTER_RUNTIME_DIR``, ``JUPYTER_CONFIG_DIR``), one simulated ``1xA100-80GB`` pool and one
kernelspec, ``python3-gpu-4g``. Two ways to take its slice:

* **embedded** — the provisioner opens a node ledger of its own (``JUPYTER_GPUSHARE_LEDGER_PATH``),
  as a single user's server does;
* **broker** — ``jupyter gpushare broker --socket …`` runs as a separate process holding another
  ledger, and the provisioner asks it over the Unix socket (``JUPYTER_GPUSHARE_BROKER_URL``): a
  check, the request, the kernel's attachment (pid and start time, checked by the broker), and the
  kernel's traffic is CurveZMQ-encrypted, as on a team box.

One round starts one kernel of each kind (the order alternates from round to round) with
``AsyncKernelManager.start_kernel()`` and waits for ``wait_for_ready()``; the time from the call to
the return is the start-to-ready latency. Kernels are shut down between starts (not timed) and
both ledgers are checked to be empty after every shutdown. One warm-up round comes first.

Reported: median, p90, min of each kind, the ratio broker/embedded of the medians (the goal), the
median same-round ratio, and the cost of the broker calls alone (a round trip of ``POST check``).
Goal: ratio <= 1.10.

Run: ``.venv/bin/python benchmarks/broker_start.py`` (15 rounds, about a minute on 2 cores;
``--quick``: 5 rounds). ``--against REV [--repeat N]`` runs it alternately on this checkout and
on the package of git revision REV (see ``against.py``) and prints the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from against import Figure, add_options, run_against, write_figures

GOAL_RATIO = 1.10
READY_TIMEOUT_S = 30.0
SIMULATE = "1xA100-80GB"
BIN = Path(sys.executable).parent


def isolate(root: Path) -> None:
    for name in ("share/jupyter", "data", "runtime", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    os.environ["JUPYTER_PATH"] = str(root / "share" / "jupyter")
    os.environ["JUPYTER_DATA_DIR"] = str(root / "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    os.environ["JUPYTER_CONFIG_DIR"] = str(root / "config")
    os.environ["JUPYTER_GPUSHARE_SIMULATE"] = SIMULATE
    os.environ["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(root / "embedded.sqlite")
    for variable in ("JUPYTER_GPUSHARE_OWNER", "JUPYTER_GPUSHARE_BROKER_URL", "CUDA_VISIBLE_DEVICES"):
        os.environ.pop(variable, None)


def start_broker(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError

    socket = root / "broker.sock"
    env = dict(os.environ, JUPYTER_GPUSHARE_LEDGER_PATH=str(root / "broker" / "ledger.sqlite"))
    broker = subprocess.Popen(
        [str(BIN / "jupyter-gpushare"), "broker", "--socket", str(socket)],
        env=env,
        stdout=(root / "broker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"unix:{socket}"
    deadline = time.monotonic() + 30
    while True:
        try:
            BrokerClient(url).call("GET", "info")
            return broker, url
        except UnreachableError:
            if broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((root / "broker.log").read_text()) from None
            time.sleep(0.05)


async def start_once(log: object) -> float:
    from jupyter_client.manager import AsyncKernelManager

    manager = AsyncKernelManager(kernel_name="python3-gpu-4g")
    began = time.perf_counter()
    await manager.start_kernel(stdout=log, stderr=log)
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=READY_TIMEOUT_S)
        elapsed = time.perf_counter() - began
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
    return elapsed


def held(url: str | None, ledger: Path) -> int:
    if url is None:
        from jupyter_gpushare.backends.local.ledger import Ledger

        return len(Ledger(ledger).records())
    from jupyter_gpushare.backends.broker_client.transport import BrokerClient

    return len(BrokerClient(url).call("GET", "kernels"))


async def run(rounds: int, root: Path, figures: str | None = None) -> int:
    from jupyter_gpushare.backends.broker_client.transport import BrokerClient
    from jupyter_gpushare.config.kernelspecs import install_kernelspecs

    install_kernelspecs(["4G"], prefix=str(root))
    broker, url = start_broker(root)
    times: dict[str, list[float]] = {"embedded": [], "broker": []}
    same_round: list[float] = []
    try:
        with (root / "kernels.log").open("w") as log:
            for round_ in range(rounds + 1):
                order = ["embedded", "broker"] if round_ % 2 else ["broker", "embedded"]
                this: dict[str, float] = {}
                for kind in order:
                    if kind == "broker":
                        os.environ["JUPYTER_GPUSHARE_BROKER_URL"] = url
                    else:
                        os.environ.pop("JUPYTER_GPUSHARE_BROKER_URL", None)
                    this[kind] = await start_once(log)
                    left = held(url if kind == "broker" else None, root / "embedded.sqlite")
                    assert left == 0, f"{left} slice(s) left after a {kind} kernel's shutdown"
                if round_ == 0:
                    continue  # warm-up
                for kind, value in this.items():
                    times[kind].append(value)
                same_round.append(this["broker"] / this["embedded"])
        client = BrokerClient(url)
        trips = []
        for _ in range(50):
            began = time.perf_counter()
            client.call("POST", "check", {"gpu_memory": "4G"})
            trips.append(time.perf_counter() - began)
    finally:
        broker.terminate()
        broker.wait(timeout=30)
        os.environ.pop("JUPYTER_GPUSHARE_BROKER_URL", None)

    print(f"{rounds} rounds (after 1 warm-up), python3-gpu-4g, simulated {SIMULATE}")
    print(f"{'kind':<10} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}")
    for kind, values in times.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        median = statistics.median(values)
        print(f"{kind:<10} {median * 1000:>10.0f} {p90 * 1000:>8.0f} {ordered[0] * 1000:>8.0f}")
    ratio = statistics.median(times["broker"]) / statistics.median(times["embedded"])
    print(f"ratio broker/embedded of the medians: {ratio:.3f} (goal <= {GOAL_RATIO:.2f})")
    print(f"median same-round ratio: {statistics.median(same_round):.3f}")
    print(f"ratio of the fastest starts: {min(times['broker']) / min(times['embedded']):.3f}")
    print(
        f"one broker round trip (POST check over the socket): median {statistics.median(trips) * 1000:.2f} ms"
    )
    print("verdict:", "goal met" if ratio <= GOAL_RATIO else "goal MISSED")
    write_figures(
        figures,
        [
            Figure("broker start-to-ready median (s)", statistics.median(times["broker"])),
            Figure("embedded start-to-ready median (s)", statistics.median(times["embedded"])),
            Figure("ratio broker/embedded (medians)", ratio),
        ],
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    add_options(parser)
    arguments = parser.parse_args(argv)
    if arguments.against:
        return run_against(
            __file__, sys.argv[1:] if argv is None else argv, arguments.against, arguments.repeat
        )
    rounds = 5 if arguments.quick else arguments.rounds
    with tempfile.TemporaryDirectory(prefix="gpushare-broker-bench-") as directory:
        root = Path(directory)
        isolate(root)
        return asyncio.run(run(rounds, root, arguments.figures))


if __name__ == "__main__":
    sys.exit(main())
