"""How a reader of Kueue's Workloads copes with what the API answers: the version Kueue serves
found once (an older Kueue serves v1beta1 only), a Role without ``list workloads`` said once and
not asked again, a passing error leaving the reason unread this time only. The API server is the
edge substituted here: a stand-in answers ``list_workloads`` as it is told."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.kueue_reads import PlaceReader, WorkloadReader
from jupyter_gpushare.backends.kubernetes.objects.kueue import Place, places_by_pod, queued_by_kueue

WORKLOAD = {"metadata": {"name": "pod-k-1"}}


class Answers:
    """``list_workloads`` answering from a script, by API version; every call recorded."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def list_workloads(self, selector: str, version: str) -> list[dict[str, Any]]:
        self.calls.append(version)
        answer = self.answers[version].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def reader(answers: Answers) -> WorkloadReader:
    return WorkloadReader(answers, logging.getLogger("test.kueue_reads"), "kernel k: ")  # type: ignore[arg-type]


def test_an_older_kueue_is_read_at_v1beta1_found_once() -> None:
    api = Answers({"v1beta2": [ClusterError("not found", 404)], "v1beta1": [[WORKLOAD], [WORKLOAD]]})
    workloads = reader(api)
    assert workloads.list("x") == [WORKLOAD]
    assert workloads.list("x") == [WORKLOAD]
    assert api.calls == ["v1beta2", "v1beta1", "v1beta1"]  # v1beta2 not asked again
    assert workloads.readable


def test_no_workload_api_at_all_stops_asking() -> None:
    api = Answers({"v1beta2": [ClusterError("not found", 404)], "v1beta1": [ClusterError("not found", 404)]})
    workloads = reader(api)
    assert workloads.list("x") is None
    assert not workloads.readable
    assert workloads.list("x") is None
    assert api.calls == ["v1beta2", "v1beta1"]


@pytest.mark.parametrize("status", [401, 403])
def test_a_refusal_is_said_once_and_not_asked_again(status: int, caplog: pytest.LogCaptureFixture) -> None:
    refused = ClusterError('workloads.kueue.x-k8s.io is forbidden: User "x" cannot list', status)
    api = Answers({"v1beta2": [refused]})
    workloads = reader(api)
    with caplog.at_level(logging.WARNING, "test.kueue_reads"):
        assert workloads.list("x") is None
        assert workloads.list("x") is None
    assert api.calls == ["v1beta2"]
    assert not workloads.readable
    [said] = [record.getMessage() for record in caplog.records]
    assert said.startswith("kernel k: Kueue's reason is not shown: workloads.kueue.x-k8s.io is forbidden")


def test_a_passing_error_leaves_the_reason_unread_this_time_only() -> None:
    api = Answers({"v1beta2": [ClusterError("the API server is unreachable", None), [WORKLOAD]]})
    workloads = reader(api)
    assert workloads.list("x") is None
    assert workloads.readable
    assert workloads.list("x") == [WORKLOAD]
    assert api.calls == ["v1beta2", "v1beta2"]


# ---- places in Kueue's queues (its visibility API) -------------------------------------------------


def pending(uid: str, local: int, cluster: int) -> dict[str, Any]:
    """A PendingWorkload as Kueue's visibility API lists it (positions from 0)."""
    return {
        "metadata": {
            "name": f"pod-{uid}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": f"p-{uid}", "uid": uid}],
        },
        "localQueueName": "gpu",
        "positionInLocalQueue": local,
        "positionInClusterQueue": cluster,
    }


NOT_SERVED = "the Kubernetes API refused to read LocalQueue gpu's pending workloads in namespace n: the server could not find the requested resource"  # noqa: E501


class Pending:
    """``pending_workloads`` answering from a script, by API version."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def pending_workloads(self, local_queue: str, version: str) -> list[dict[str, Any]]:
        self.calls.append(version)
        answer = self.answers[version].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def place_reader(api: Pending) -> PlaceReader:
    return PlaceReader(api, logging.getLogger("test.kueue_reads"), "kernel k: ")  # type: ignore[arg-type]


def test_places_are_read_by_pod_counting_from_one() -> None:
    api = Pending({"v1beta2": [[pending("a", 0, 2), pending("b", 1, 3)]]})
    assert place_reader(api).places("gpu") == {"a": Place(1, 3, 2), "b": Place(2, 4, 2)}


def test_an_older_kueues_visibility_api_is_found_once_and_a_missing_queue_is_no_place() -> None:
    api = Pending(
        {
            "v1beta2": [ClusterError(NOT_SERVED, 404)],
            "v1beta1": [[pending("a", 0, 0)], ClusterError('localqueues "gpu" not found', 404)],
        }
    )
    places = place_reader(api)
    assert places.places("gpu") == {"a": Place(1, 1, 1)}
    assert places.places("gpu") is None  # this time only
    assert places.readable and api.calls == ["v1beta2", "v1beta1", "v1beta1"]


def test_no_visibility_api_is_said_once_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    api = Pending({"v1beta2": [ClusterError(NOT_SERVED, 404)], "v1beta1": [ClusterError(NOT_SERVED, 404)]})
    places = place_reader(api)
    with caplog.at_level(logging.INFO, "test.kueue_reads"):
        assert places.places("gpu") is None
        assert places.places("gpu") is None
    assert not places.readable and api.calls == ["v1beta2", "v1beta1"]
    assert [r.getMessage() for r in caplog.records] == [
        "kernel k: Kueue's visibility API is not served (Kueue's VisibilityOnDemand): positions in its "
        "queues are not shown"
    ]


def test_a_role_without_pendingworkloads_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    api = Pending({"v1beta2": [ClusterError("forbidden", 403)]})
    places = place_reader(api)
    with caplog.at_level(logging.WARNING, "test.kueue_reads"):
        assert places.places("gpu") is None
        assert places.places("gpu") is None
    assert not places.readable and api.calls == ["v1beta2"]
    assert (
        len(caplog.records) == 1
        and "position in Kueue's queue is not shown" in caplog.records[0].getMessage()
    )


def test_the_sentence_says_the_place() -> None:
    assert (
        queued_by_kueue("gpu", "no quota", Place(2, 4, 3))
        == "queued by Kueue in LocalQueue gpu (position 2 of 3; 4 in its ClusterQueue): no quota"
    )
    assert queued_by_kueue("gpu", None, Place(1, 1, 1)) == (
        "queued by Kueue in LocalQueue gpu (position 1 of 1): waiting for its admission"
    )
    assert queued_by_kueue("gpu", "no quota") == "queued by Kueue in LocalQueue gpu: no quota"
    # A workload that is not a pod's, or has no positions, has no place.
    assert places_by_pod([{"metadata": {"ownerReferences": [{"kind": "Job", "uid": "j"}]}}]) == {}
