"""How a reader of Kueue's Workloads copes with what the API answers: the version Kueue serves
found once (an older Kueue serves v1beta1 only), a Role without ``list workloads`` said once and
not asked again, a passing error leaving the reason unread this time only. The API server is the
edge substituted here: a stand-in answers ``list_workloads`` as it is told."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.kueue_reads import WorkloadReader

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
