"""Sampler cost: CPU time of one usage-monitor round with 1, 10 and 100 tracked kernels.

Method: a simulated 4xA100-80GB pool in a temporary ledger; N slices held by this process, each
with a declared usage (as simulated kernels report it); ``UsageMonitor.sample_once()`` — read the
ledger, attribute, assess, write usage and warnings in one transaction — is timed with
``time.process_time`` over many rounds. At the default ``sample_interval`` of 1 s, the share of
one core is the CPU time of one round. Beside it, in the same run: a bare read of the same ledger
rows (``Ledger.records()``), what every round paid before rounds shared one read per change of
the ledger with the process's views (``Ledger.state()``): a round that finds the ledger unchanged
reads nothing. Goal: <= 2% of one core at 1 Hz with 100 kernels.

    python benchmarks/sampler.py [--rounds 200] [--quick] [--against REV [--repeat N]]

``--against REV`` runs it alternately on this checkout and on the package of git revision REV
(see ``against.py``) and prints the ratios of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from against import Figure, add_options, run_against, write_figures

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.sizes import MiB

GOAL_PERCENT_OF_CORE = 2.0


def cpu_seconds(action, rounds: int) -> float:  # type: ignore[no-untyped-def]
    started = time.process_time()
    for _ in range(rounds):
        action()
    return (time.process_time() - started) / rounds


def measure(kernels: int, rounds: int, directory: Path) -> tuple[float, float]:
    service = LocalBackend(
        GPUShare(simulate="4xA100-80GB", ledger_path=str(directory / f"ledger-{kernels}.sqlite"))
    )

    async def fill() -> None:
        for index in range(kernels):
            kernel_id = f"kernel-{index}"
            await service.acquire(kernel_id, service.check("512M"))
            service.ledger.report_usage(kernel_id, (index % 5) * 100 * MiB, index % 50, "simulated")

    asyncio.run(fill())
    assert service.monitor.sample_once() == kernels
    per_round = cpu_seconds(service.monitor.sample_once, rounds)
    baseline = cpu_seconds(service.ledger.records, rounds)
    return per_round, baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    add_options(parser)
    arguments = parser.parse_args(argv)
    if arguments.against:
        return run_against(
            __file__, sys.argv[1:] if argv is None else argv, arguments.against, arguments.repeat
        )
    rounds = 30 if arguments.quick else arguments.rounds
    print(f"{'kernels':>8} {'CPU/round':>11} {'% core @1Hz':>12} {'bare read':>10} {'ratio':>6}")
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as directory:
        for kernels in (1, 10, 100):
            per_round, baseline = measure(kernels, rounds, Path(directory))
            share = 100 * per_round  # seconds of CPU per 1 s interval, as a percentage
            print(
                f"{kernels:>8} {per_round * 1000:>9.2f}ms {share:>11.2f}% "
                f"{baseline * 1000:>8.2f}ms {per_round / baseline:>6.1f}"
            )
            figures.append(Figure(f"CPU ms per round, {kernels} kernels", 1000 * per_round))
            if kernels == 100:
                verdict = "PASS" if share <= GOAL_PERCENT_OF_CORE else "FAIL"
                print(
                    f"goal: <= {GOAL_PERCENT_OF_CORE}% of one core with 100 kernels: {verdict} ({share:.2f}%)"
                )
    write_figures(arguments.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
