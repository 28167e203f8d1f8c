"""The wait estimate for Kueue's queues against real waits, on the test cluster with Kueue.

Method
------
The test cluster (``tests/cluster/``: Kubernetes' own control plane and two simulated nodes
with four time-sliced shares of one 80 GiB card each, which run the pods the real scheduler binds
as local processes), Kueue built from its Go module with its visibility API
(``tests/cluster/kueue.py``), a ClusterQueue holding two ``nvidia.com/gpu`` and a LocalQueue
``gpu``; the GPU broker (``jupyter gpushare broker --backend kubernetes``, NVIDIA's device
plugin preset, ``c.GPUShare.kueue_queue = "gpu"``, the shipped broker Role's Kueue rules) on a
Unix socket. Its kernel pods run ``sleep``.

The scripted sequence (``tests/cluster/kueue_rounds.py``, where it is described; a shorter one is
``tests/integration/test_kueue_wait.py``): rounds of two *holders* held for their scripted
holds (4G for 8 s, 40G for 24 s) and a 4G *waiter* that Kueue's quota holds back until a holder
ends; four warm-up rounds, then the measured ones through a fixed pattern of holders. Each
waiter's first ``expected_start`` from the broker is set against when Kueue admitted it, next to
the naive estimate of the same moment (its place in line x the mean finished hold / the slots).

The holds are seconds, not the minutes and hours of real kernels, so that a run takes minutes:
the broker's 2-second accounting round and Kueue's and the broker's reaction (about a second)
weigh more in these errors than they would on a real cluster.

Figures: each estimated wait's real wait and both errors, the mean absolute error of each, the
ratio estimate/naive (goal: below 1: better than the naive estimate) and the estimate's mean
error as a share of the mean real wait (goal: at most ``BOUND``), and the broker's log line of
each first estimate (the model's, the naive one, which was told).

Run: ``.venv/bin/python benchmarks/kueue_wait.py`` (needs root, as Kueue's tests do, the ``test``
and ``cluster`` extras, the control plane and Kueue binaries: ``make controlplane kueue``);
``--quick`` runs one round of each pattern after the warm-up, with holds of 4 s and 12 s;
``--keep DIR`` keeps the broker's log and accounting file (its holds, kept and judged estimates).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster import ControlPlane, KubeCluster, Namespace  # noqa: E402
from tests.cluster.kueue import Kueue, broker_grants, gpu_queues, in_namespaces  # noqa: E402
from tests.cluster.kueue_rounds import (  # noqa: E402
    QUOTA,
    Kernel,
    Script,
    broker,
    first_estimates,
    nodes,
    play,
    score,
)

NAMESPACE = "kueue-wait"
IMAGE = "jupyter-gpushare-kernel:bench"
SCRIPT = Script(small=("4G", 8.0), large=("40G", 24.0))
QUICK = Script(small=("4G", 4.0), large=("40G", 12.0))  # as tests/integration/test_kueue_wait.py
ACCOUNTING = "gpushare-broker-accounting.sqlite"  # the broker's file, in its runtime directory
BOUND = 0.35  # goal: the estimate's mean error, as a share of the mean real wait


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="copy the broker's log and accounting file (its holds, kept and judged estimates) here",
    )
    arguments = parser.parse_args()
    script = QUICK if arguments.quick else SCRIPT
    rounds = len(script.pattern) * (1 if arguments.quick else 3)
    if os.geteuid() != 0:
        print("kueue_wait: needs root (Kueue runs in a mount namespace of its own)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpushare-kueue-wait-") as directory:
        root = Path(directory)
        with ControlPlane(root / "controlplane") as plane:
            namespace = Namespace(plane, NAMESPACE).create().name
            with (
                Kueue(plane, root / "kueue", namespaces=in_namespaces(namespace), visibility=True),
                KubeCluster(plane, namespace, root / "cluster", nodes()) as cluster,
            ):
                for manifest in [*gpu_queues(namespace, gpus=QUOTA), *broker_grants(namespace)]:
                    cluster.admin.apply(manifest)
                small, large = script.small, script.large
                print(
                    f"Kueue wait estimate: {len(script.warm_up)} rounds to warm up, {rounds} measured, "
                    f"quota {QUOTA} GPUs, holds {small[0]} {small[1]:g} s and {large[0]} {large[1]:g} s",
                    flush=True,
                )
                with broker(root, cluster, IMAGE) as client:
                    measured = play(client, script, rounds, lambda line: print(f"   {line}", flush=True))
                if arguments.keep is not None:
                    keep(root, arguments.keep)
                told = first_estimates(root / "broker.log")
                print(f"the broker's first estimates ({len(told)}):")
                for line in told:
                    print(f"   {line}")
    return report(measured)


def keep(root: Path, into: Path) -> None:
    """The broker's log, and its accounting file as one file (sqlite's backup: what its
    write-ahead log still holds included), for a look at what the estimates went by."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "broker.log", into / "broker.log")
    with (
        contextlib.closing(sqlite3.connect(root / "runtime" / ACCOUNTING)) as source,
        contextlib.closing(sqlite3.connect(into / ACCOUNTING)) as target,
    ):
        source.backup(target)
    print(f"kept in {into}: broker.log, {ACCOUNTING}")


def report(measured: list[Kernel]) -> int:
    scored = score(measured)
    if not scored.errors or len(scored.errors) < scored.waiters // 2:
        print(f"verdict: missed (only {len(scored.errors)} of {scored.waiters} waits were estimated)")
        return 0
    mean_real, mean_error = statistics.mean(scored.real), statistics.mean(scored.errors)
    mean_naive = statistics.mean(scored.naive_errors)
    print(f"waits estimated: {len(scored.errors)} of {scored.waiters}; mean real wait {mean_real:.1f} s")
    print(f"mean absolute error: estimate {mean_error:.1f} s, naive {mean_naive:.1f} s")
    print(f"ratio estimate/naive: {scored.ratio:.2f} (goal < 1)")
    print(f"estimate's error / mean real wait: {scored.share:.2f} (goal <= {BOUND:g})")
    print(f"verdict: {'met' if scored.ratio < 1 and scored.share <= BOUND else 'missed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
