"""The broker's wait estimate for Kueue's queues against real waits (issue 41): the scripted
sequence of ``tests/cluster/kueue_rounds.py`` (``benchmarks/kueue_wait.py`` plays it longer,
with longer holds) on the test cluster with Kueue from its module: a ClusterQueue of two GPUs,
holders held 4 s (4G) and 12 s (40G), a 4G waiter Kueue holds back each round; four warm-up
rounds, then three times the four rounds of the pattern.

The bound: the estimate's mean absolute error at most 0.35 of the mean wait, and below the naive
estimate's (place in line x the mean hold / the slots), over all twelve: every estimate told
counts, those made before ten were judged against placements too (until then the estimator checks
its model on past holds; docs/benchmarks.md tells how that check once told the naive estimate
for rounds in a row).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..cluster import ControlPlane, KubeCluster
from ..cluster.kueue import Kueue, broker_grants, gpu_queues
from ..cluster.kueue_rounds import QUOTA, Script, broker, first_estimates, nodes, play, score
from ..support.nodes import IMAGE
from .conftest import module_kube
from .test_kueue import applied

pytestmark = pytest.mark.integration

SCRIPT = Script(small=("4G", 4.0), large=("40G", 12.0))
BOUND = 0.35


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, kube_namespace: str, kueue: Kueue
) -> Iterator[KubeCluster]:
    root = tmp_path_factory.mktemp("kueue-wait")
    with (
        module_kube(control_plane, kube_namespace, root / "cluster", nodes()) as made,
        applied(made, [*gpu_queues(made.namespace, gpus=QUOTA), *broker_grants(made.namespace)]),
    ):
        yield made


def test_the_estimate_of_a_kueue_wait_beats_the_naive_one_within_its_bound(
    cluster: KubeCluster, tmp_path: Path
) -> None:
    with broker(tmp_path, cluster, IMAGE) as client:
        measured = play(client, SCRIPT, 3 * len(SCRIPT.pattern), print)
    for line in first_estimates(tmp_path / "broker.log"):
        print(line)
    scored = score(measured)
    mean_wait, mean_error = statistics.mean(scored.real), statistics.mean(scored.errors)
    print(
        f"{len(scored.errors)} of {scored.waiters} waits estimated; mean wait {mean_wait:.1f} s; mean "
        f"error: estimate {mean_error:.1f} s, naive {statistics.mean(scored.naive_errors):.1f} s; "
        f"ratio {scored.ratio:.2f}, share {scored.share:.2f}"
    )
    # A waiter admitted before the broker's next look (a second) has no estimate to judge.
    assert scored.waiters == 3 * len(SCRIPT.pattern) and len(scored.errors) >= 9
    assert scored.ratio < 1 and scored.share <= BOUND
