"""The wait estimate for Kueue's queues: a ClusterQueue's quota as slots (pure), the local
queue's estimate played on them, the reader of the quota against what the API answers (the API
server is the edge substituted: a stand-in answers as it is told), and the broker's estimates
of the pods Kueue holds, kept in a real accounting file to be judged."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.broker.kueue_waits import Gated, KueueWaits
from jupyter_gpushare.backends.kubernetes.broker.pod_accounting import PodAccounting
from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.kueue_reads import QuotaReader
from jupyter_gpushare.backends.kubernetes.objects.accounted import Accounted
from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    ADMISSION_GATE,
    QUEUE_LABEL,
    Place,
    queued_by_kueue,
)
from jupyter_gpushare.backends.kubernetes.objects.kueue_wait import (
    Holder,
    Quota,
    asks,
    kueue_estimates,
    quota_of,
    slots,
)
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.placement.wait_estimate import History
from jupyter_gpushare.core.sizes import GiB

from .test_pool import pod

NOW = 1_000_000.0


def cluster_queue(gpus: object = 2, reserved: object = None, flavors: int = 1) -> dict[str, Any]:
    resources = [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "10Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
    ]
    queue: dict[str, Any] = {
        "metadata": {"name": "gpu"},
        "spec": {
            "resourceGroups": [
                {"flavors": [{"name": f"flavor-{n}", "resources": resources} for n in range(flavors)]}
            ]
        },
    }
    if reserved is not None:
        queue["status"] = {
            "flavorsReservation": [
                {"name": "flavor-0", "resources": [{"name": "nvidia.com/gpu", "total": reserved}]}
            ]
        }
    return queue


# ---- the quota (pure) --------------------------------------------------------------------------


def test_a_cluster_queues_quota_adds_its_flavors_and_reads_what_is_reserved() -> None:
    quota = quota_of(cluster_queue(gpus=2, reserved="3", flavors=2))
    assert quota.cluster_queue == "gpu"
    assert quota.nominal["nvidia.com/gpu"] == 4 and quota.nominal["memory"] == 20 * 2**40
    assert quota.reserved == {"nvidia.com/gpu": 3}
    assert quota_of({}) == Quota("?", {}, {})  # nothing to read: no quota, not an error


def test_a_pods_asks_are_its_containers_requests_else_limits() -> None:
    manifest = {
        "spec": {
            "containers": [
                {
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "memory": "2Gi"},
                        "requests": {"memory": "1Gi"},
                    }
                },
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            ]
        }
    }
    # Memory asked twice (a request over a limit), half a CPU: no whole unit.
    assert asks(manifest) == {"nvidia.com/gpu": 1, "memory": 2 * 2**30}
    assert asks(pod("k1", mode="vgpu"))  # a kernel pod of ours asks something


def test_slots_are_the_kernels_the_quota_holds_at_once_the_scarcest_resource_deciding() -> None:
    asked = {"nvidia.com/gpu": 1, "memory": 2**30, "example.com/unknown": 5}
    assert slots(quota_of(cluster_queue(gpus=3)), asked, []) == 3
    # What others than our kernels reserve is taken to stay: one of four GPUs is a batch job's.
    ours = [{"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 1}]
    assert slots(quota_of(cluster_queue(gpus=4, reserved=3)), asked, ours) == 3
    # A pod asking two GPUs fits half as many times.
    assert slots(quota_of(cluster_queue(gpus=4)), {"nvidia.com/gpu": 2}, []) == 2
    # A ClusterQueue covering nothing the pod asks: no model of it.
    assert slots(quota_of(cluster_queue()), {"example.com/unknown": 1}, []) is None


# ---- the estimate on slots (pure) ----------------------------------------------------------------


def bimodal_history() -> History:
    """Small kernels held 60 s, large ones 600 s; ten of each ended, the last an hour ago."""
    holds = tuple([(4 * GiB, 60.0)] * 10 + [(40 * GiB, 600.0)] * 10)
    ended = tuple(NOW - 3600 - index for index in range(len(holds)))
    return History(holds, ended)


def test_behind_two_large_kernels_the_wait_is_theirs_not_the_mean_holds() -> None:
    held = [Holder("a", "alice", 40 * GiB, NOW - 100), Holder("b", "bob", 40 * GiB, NOW - 100)]
    both = kueue_estimates(NOW, Holder("me", "carol", 4 * GiB), 0, held, 2, bimodal_history())
    assert both.model is not None and both.naive is not None and both.answer is not None
    # The first of them ends about 500 s from now (held 100 s of about 600); the naive estimate
    # (one place x the median hold / 2 slots) says under three minutes.
    assert 400 <= both.model - NOW <= 520
    assert both.naive - NOW == pytest.approx(165.0)
    assert abs(both.answer - (NOW + 500)) <= abs(both.naive - (NOW + 500))


def test_a_small_kernel_held_frees_its_slot_first() -> None:
    held = [Holder("a", "alice", 4 * GiB, NOW - 30), Holder("b", "bob", 40 * GiB, NOW - 30)]
    both = kueue_estimates(NOW, Holder("me", "carol", 4 * GiB), 0, held, 2, bimodal_history())
    assert both.model is not None and both.model - NOW <= 60


def test_workloads_ahead_wait_for_slots_too() -> None:
    held = [Holder("a", "alice", 4 * GiB, NOW), Holder("b", "bob", 4 * GiB, NOW)]
    history = bimodal_history()
    first = kueue_estimates(NOW, Holder("me", "carol", 4 * GiB), 0, held, 2, history).model
    third = kueue_estimates(NOW, Holder("me", "carol", 4 * GiB), 2, held, 2, history).model
    assert first is not None and third is not None and third > first


def test_no_history_no_slots_no_estimate() -> None:
    me = Holder("me", "carol", 4 * GiB)
    assert kueue_estimates(NOW, me, 0, [], 2, History(((GiB, 60.0),) * 4)).answer is None
    assert kueue_estimates(NOW, me, 0, [], 0, bimodal_history()).answer is None
    # Borrowed quota: more of our kernels hold it than the nominal quota has slots.
    held = [Holder(k, "alice", 4 * GiB, NOW - 10) for k in "abc"]
    assert kueue_estimates(NOW, me, 0, held, 2, bimodal_history()).answer is not None


def test_a_waiting_pods_words_say_its_wait() -> None:
    said = queued_by_kueue("gpu", "no quota", Place(2, 4, 3), wait=400)
    where = "position 2 of 3; 4 in its ClusterQueue; wait about 7 min"
    assert said == f"queued by Kueue in LocalQueue gpu ({where}): no quota"
    assert queued_by_kueue("gpu", None, None, wait=20) == (
        "queued by Kueue in LocalQueue gpu (wait less than a minute): waiting for its admission"
    )


# ---- the reader of the quota ----------------------------------------------------------------------


class Api:
    """``local_queue`` and ``cluster_queue`` answering from scripts; every call recorded."""

    def __init__(self, local: list[Any], cluster: list[Any]) -> None:
        self.local, self.cluster = local, cluster
        self.calls: list[tuple[str, str]] = []

    def _answer(self, script: list[Any]) -> dict[str, Any]:
        answer = script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    def local_queue(self, name: str, version: str) -> dict[str, Any]:
        self.calls.append(("local", version))
        return self._answer(self.local)

    def cluster_queue(self, name: str, version: str) -> dict[str, Any]:
        self.calls.append(("cluster", version))
        return self._answer(self.cluster)


LOCAL = {"spec": {"clusterQueue": "gpu"}}


def test_the_local_queue_is_read_once_its_cluster_queue_each_time() -> None:
    api = Api([LOCAL], [cluster_queue(gpus=2), cluster_queue(gpus=3)])
    reader = QuotaReader(api, logging.getLogger("test"))  # type: ignore[arg-type]
    first, second = reader.quota("gpu"), reader.quota("gpu")
    assert first is not None and first.nominal["nvidia.com/gpu"] == 2
    assert second is not None and second.nominal["nvidia.com/gpu"] == 3
    assert api.calls == [("local", "v1beta2"), ("cluster", "v1beta2"), ("cluster", "v1beta2")]
    assert reader.feeds == {"gpu": "gpu"}


def test_a_role_without_the_rules_is_said_once_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    api = Api([LOCAL], [ClusterError("clusterqueues is forbidden", 403)])
    reader = QuotaReader(api, logging.getLogger("test"))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        assert reader.quota("gpu") is None
        assert reader.quota("gpu") is None
    assert not reader.readable and len(api.calls) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "no wait estimate for Kueue's queues: clusterqueues is forbidden"
    ]


def test_an_older_kueue_and_a_passing_error() -> None:
    served = "the server could not find the requested resource"
    api = Api([ClusterError(served, 404), LOCAL], [ClusterError("timeout", 504), cluster_queue()])
    reader = QuotaReader(api, logging.getLogger("test"))  # type: ignore[arg-type]
    assert reader.quota("gpu") is None  # this time only
    assert reader.quota("gpu") is not None and reader.readable
    assert api.calls == [
        ("local", "v1beta2"),
        ("local", "v1beta1"),
        ("cluster", "v1beta1"),
        ("cluster", "v1beta1"),
    ]


# ---- the broker's estimates, kept to be judged ---------------------------------------------------


def gated(kernel_id: str, uid: str) -> dict[str, Any]:
    manifest = pod(kernel_id, owner="carol", memory="4G", node_name=None, phase="Pending")
    manifest["metadata"]["uid"] = uid
    manifest["metadata"]["labels"][QUEUE_LABEL] = "gpu"
    manifest["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    return manifest


def admitted(kernel_id: str) -> dict[str, Any]:
    manifest = pod(kernel_id, memory="40G")
    manifest["metadata"]["labels"][QUEUE_LABEL] = "gpu"
    return manifest


def accounting_with_holds(path: Path, count: int) -> PodAccounting:
    """A broker's accounting file in which ``count`` kernel pods were held and ended."""
    accounting = PodAccounting(path, lambda: GPUShare())
    for number in range(count):
        held = Accounted(f"old-{number}", "alice", "running", 4 * GiB, None, time.time())
        accounting.look(lambda held=held: {held.kernel_id: held})  # type: ignore[misc]
        accounting.look(dict)
    return accounting


def test_the_broker_estimates_a_gated_pod_and_keeps_its_first_estimates(tmp_path: Path) -> None:
    accounting = accounting_with_holds(tmp_path / "accounting.sqlite", 6)
    waits = KueueWaits(Api([LOCAL], [cluster_queue(gpus=2, reserved="2")] * 5), accounting)  # type: ignore[arg-type]
    # As the broker sees the kernel now: waiting (its row is written before its estimates).
    accounting.seen_one = lambda kernel_id: Accounted(
        kernel_id, "carol", "queued", 4 * GiB, None, time.time()
    )
    me = Gated("me", "carol", 4 * GiB, gated("me", "uid-me"))
    pods = [admitted("a"), admitted("b"), me.pod]
    waits.estimate([me], pods, {"uid-me": Place(1, 1, 1)})
    assert set(waits.expected) == {"me"} and waits.expected["me"] >= time.time() - 1
    with sqlite3.connect(tmp_path / "accounting.sqlite") as db:
        assert [row[0] for row in db.execute("SELECT kernel_id FROM acct_estimates")] == ["me"]
    # Its place unknown (no visibility API): no estimate.
    waits.estimate([me], pods, {})
    assert waits.expected == {}


def test_too_little_history_no_accounting_or_no_quota_no_estimate(tmp_path: Path) -> None:
    me = Gated("me", "carol", 4 * GiB, gated("me", "uid-me"))
    places = {"uid-me": Place(1, 1, 1)}
    few = KueueWaits(Api([LOCAL], [cluster_queue()]), accounting_with_holds(tmp_path / "few.sqlite", 4))  # type: ignore[arg-type]
    few.estimate([me], [me.pod], places)
    assert few.expected == {}
    none = KueueWaits(Api([], []), None)  # type: ignore[arg-type]
    none.estimate([me], [me.pod], places)
    assert none.expected == {}
    forbidden = Api([ClusterError("forbidden", 403)], [])
    denied = KueueWaits(forbidden, accounting_with_holds(tmp_path / "denied.sqlite", 6))  # type: ignore[arg-type]
    denied.estimate([me], [me.pod], places)
    assert denied.expected == {} and not denied.quotas.readable
