"""Reading kernel pods as the API reports them
(jupyter_gpushare.backends.kubernetes.objects.status): pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.status import (
    container_problem,
    describe_limits,
    pending_state,
    termination,
    unschedulable_reason,
)


def pod_status(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "kernel"}]}, "status": status}


def terminated(code: int, reason: str | None = None, name: str = "kernel", **extra: Any) -> dict[str, Any]:
    state = {"exitCode": code, **({"reason": reason} if reason else {}), **extra}
    return {"name": name, "state": {"terminated": state}}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            pod_status(phase="Succeeded", containerStatuses=[terminated(0, "Completed")]),
            (0, "Completed (exit code 0)"),
        ),
        (
            pod_status(phase="Failed", containerStatuses=[terminated(137, "OOMKilled")]),
            (137, "OOMKilled (exit code 137)"),
        ),
        (pod_status(phase="Failed", containerStatuses=[terminated(1)]), (1, "Error (exit code 1)")),
        (
            pod_status(
                phase="Failed",
                reason="Evicted",
                message="The node was low on resource: memory.",
                containerStatuses=[terminated(137, "ContainerStatusUnknown")],
            ),
            (137, "Evicted: The node was low on resource: memory."),
        ),
        (pod_status(phase="Failed", reason="DeadlineExceeded"), (1, "DeadlineExceeded")),
        (
            pod_status(
                phase="Failed",
                initContainerStatuses=[terminated(1, "Error", "connection", message="cp: Permission denied")],
                containerStatuses=[{"name": "kernel", "state": {"waiting": {"reason": "PodInitializing"}}}],
            ),
            (1, "Error (exit code 1): cp: Permission denied"),
        ),
        (pod_status(phase="Failed"), (1, "the pod Failed")),
    ],
)
def test_why_a_pod_ended(status: dict[str, Any], expected: tuple[int, str]) -> None:
    assert termination(status) == expected


def test_what_a_waiting_pod_is_waiting_for() -> None:
    unplaced = pod_status(
        phase="Pending",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}
        ],
    )
    assert unschedulable_reason(unplaced, []) == "0/2 nodes"
    events = [{"reason": "FailedScheduling", "message": "0/3 nodes are available"}]
    assert unschedulable_reason(pod_status(phase="Pending"), events) == "0/3 nodes are available"
    placed = {**pod_status(phase="Pending"), "spec": {"nodeName": "n1", "containers": []}}
    assert unschedulable_reason(placed, events) is None
    pulling = pod_status(
        phase="Pending",
        containerStatuses=[{"name": "kernel", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    )
    assert pending_state(pulling, []) == "pending: kernel ContainerCreating"
    assert pending_state(
        pod_status(phase="Pending"), [{"reason": "Pulling", "message": 'Pulling image "x"'}]
    ) == ('pending: Pulling: Pulling image "x"')
    bad = pod_status(
        phase="Pending",
        containerStatuses=[
            {
                "name": "kernel",
                "image": "img",
                "state": {"waiting": {"reason": "InvalidImageName", "message": "m"}},
            }
        ],
    )
    assert container_problem(bad) == ("InvalidImageName", "m", "img")


def test_what_an_unschedulable_pod_asked_for() -> None:
    pod = {
        "metadata": {"annotations": {"gpu-memory": "6144"}},
        "spec": {"containers": [{"name": "kernel", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    assert describe_limits(pod) == "asked for nvidia.com/gpu=1, gpu-memory=6144"
    assert describe_limits({"spec": {"containers": [{"name": "kernel"}]}}) == "asked for no GPU"


def test_events_of_both_apis_sort_by_time_whatever_their_precision() -> None:
    """kube-scheduler writes events.k8s.io events (eventTime, microseconds), kubelet core ones
    (lastTimestamp, to the second). Within one second only the API's order (by name: the time in
    nanoseconds) is right: as text the scheduler's came first, as exact times last."""
    from jupyter_gpushare.backends.kubernetes.cluster.cluster import event_time

    listed = [  # as the API lists them
        {"metadata": {"name": "p.100"}, "reason": "Failed", "lastTimestamp": "2026-01-01T00:00:05Z"},
        {
            "metadata": {"name": "p.200"},
            "reason": "FailedScheduling",
            "eventTime": "2026-01-01T00:00:05.250000Z",
        },
        {"metadata": {"name": "p.300"}, "reason": "BackOff", "lastTimestamp": "2026-01-01T00:00:05Z"},
        {"metadata": {"name": "p.050"}, "reason": "Pulled", "lastTimestamp": "2026-01-01T00:00:06Z"},
        {"reason": "Undated"},
        {"reason": "Zoneless", "metadata": {"creationTimestamp": "2026-01-01T00:00:07"}},  # taken as UTC
    ]
    ordered = [event["reason"] for event in sorted(listed, key=event_time)]
    assert ordered == ["Undated", "Failed", "FailedScheduling", "BackOff", "Pulled", "Zoneless"]
