"""Kernel pods for Kueue (``c.GPUShare.kueue_queue``): the queue label Kueue's plain-pod
integration reads, what a start says while Kueue's gate holds the pod, and Kueue's reason read
from its Workload (pure)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from traitlets import TraitError

from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    ADMISSION_GATE,
    JOB_UID_LABEL,
    QUEUE_LABEL,
    held_by_kueue,
    stopped_by_kueue,
    stopped_in_events,
    why_waiting,
    why_waiting_by_pod,
    workload_selector,
    workloads_selector,
)
from jupyter_gpushare.backends.kubernetes.objects.starting import progress
from jupyter_gpushare.backends.kubernetes.objects.status import termination
from jupyter_gpushare.cli import main
from tests.support.k8s_pods import build, settings, validate

# Kueue v0.15.2's words on the Workload of a plain pod that does not fit the quota
# (tests/integration/test_kueue.py reads them from the real controller).
NO_QUOTA = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
    "flavor default-flavor, 1 more needed"
)


def test_each_kernel_pod_is_labelled_for_the_local_queue() -> None:
    pod = build(settings(resource_preset="nvidia", kueue_queue="gpu"), mode="exclusive", memory="whole")
    assert pod["metadata"]["labels"][QUEUE_LABEL] == "gpu"
    # Ours stay: the label is added, nothing of the pod's identity is replaced.
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "jupyter-gpushare-kernel"
    assert not pod["spec"].get("schedulingGates")  # Kueue's webhook adds its gate, not us
    validate(pod)


def test_no_queue_no_label() -> None:
    pod = build(settings(resource_preset="nvidia"), mode="exclusive", memory="whole")
    assert QUEUE_LABEL not in pod["metadata"]["labels"]


def test_render_pod_shows_the_queue_label(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "nvidia")
    monkeypatch.setenv("JUPYTER_GPUSHARE_KUEUE_QUEUE", "team-a")
    assert main(["render-pod", "--memory", "whole", "--mode", "exclusive"]) == 0
    pod = yaml.safe_load(capsys.readouterr().out)
    assert pod["metadata"]["labels"][QUEUE_LABEL] == "team-a"


@pytest.mark.parametrize("name", ["GPU", "team_a", "-gpu", "a" * 64, "gpu queue"])
def test_a_name_no_local_queue_can_have_is_refused_with_the_reason(name: str) -> None:
    with pytest.raises(TraitError) as refused:
        settings(kueue_queue=name)
    assert str(refused.value) == (
        f"GPUShare.kueue_queue: {name!r} is not a LocalQueue name (lowercase letters, digits, "
        "'-' and '.', starting and ending with a letter or digit, at most 63 characters)"
    )


def gated(queue: str = "gpu", uid: str | None = "u-1") -> dict[str, Any]:
    """A kernel pod as Kueue's webhook leaves it: gated, Pending, unscheduled."""
    return {
        "metadata": {"name": "gpushare-kernel-k", "labels": {QUEUE_LABEL: queue}, "uid": uid},
        "spec": {"schedulingGates": [{"name": ADMISSION_GATE}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                }
            ],
        },
    }


def test_a_pod_behind_kueues_gate_is_held_and_its_workload_is_found_by_its_uid() -> None:
    assert held_by_kueue(gated("team-a")) == "team-a"
    admitted = gated()
    admitted["spec"]["schedulingGates"] = []
    assert held_by_kueue(admitted) is None
    other = gated()
    other["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    assert held_by_kueue(other) is None
    assert workload_selector(gated(uid="8c1d")) == "kueue.x-k8s.io/job-uid=8c1d"
    assert workload_selector(gated(uid=None)) is None


def workload(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "pod-gpushare-kernel-k-1a2b3"}, "status": {"conditions": list(conditions)}}


def test_kueues_reason_is_the_quota_reserved_message() -> None:
    no_quota = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": NO_QUOTA}
    assert why_waiting([workload(no_quota)]) == NO_QUOTA
    checks = {"type": "Admitted", "status": "False", "message": "The workload has not all checks ready"}
    reserved = {"type": "QuotaReserved", "status": "True", "message": "Quota reserved in ClusterQueue gpu"}
    assert why_waiting([workload(reserved, checks)]) == "The workload has not all checks ready"
    assert why_waiting([workload()]) is None  # made, not looked at yet
    assert why_waiting([]) is None  # not made yet


def test_a_gated_pod_waits_past_the_unschedulable_grace_until_launch_timeout() -> None:
    """The broker's view of a start (from its watch): queued by Kueue, not unschedulable."""
    times = {"unschedulable_grace": 10.0, "launch_timeout": 300.0}
    waiting = progress(gated(), "gpushare-kernel-k", waited=200.0, unschedulable_for=200.0, **times)
    assert (waiting.state, waiting.unschedulable) == ("starting", False)
    assert waiting.detail == "pending: queued by Kueue in LocalQueue gpu: waiting for its admission"
    late = progress(gated(), "gpushare-kernel-k", waited=300.0, unschedulable_for=0.0, **times)
    assert late.state == "failed"
    assert late.detail == (
        "the kernel pod gpushare-kernel-k did not start within 300 s (c.GPUShare.launch_timeout); "
        "last: pending: queued by Kueue in LocalQueue gpu: waiting for its admission"
    )


# Kueue v0.15.2's words on a plain pod it preempted to give a cohort's lender its quota back
# (tests/integration/test_kueue.py sees the real controller set them).
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 5b0c, JobUID: 8c1d) due to reclamation within the "
    "cohort; preemptor path: /research/team-b; preemptee path: /research/team-a"
)


def stopped(reason: str, message: str = PREEMPTED, *containers: dict[str, Any]) -> dict[str, Any]:
    """A kernel pod Kueue stopped as its plain-pod integration does: the TerminationTarget
    condition first, then the deletion."""
    pod = gated()
    pod["spec"]["schedulingGates"] = []
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "TerminationTarget", "status": "True", "reason": reason, "message": message},
        ],
        "containerStatuses": list(containers),
    }
    return pod


def test_a_kernel_kueue_preempted_says_so_in_kueues_words() -> None:
    pod = stopped("WorkloadEvictedDueToPreempted")
    assert stopped_by_kueue(pod) == f"preempted by Kueue: {PREEMPTED}"
    # Still running (its container has a grace period): the end is Kueue's, not the container's.
    assert termination(pod) == (1, f"preempted by Kueue: {PREEMPTED}")
    # Its container then ends on the SIGTERM: its code, still Kueue's reason.
    sigterm = {"name": "kernel", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
    ended = stopped("WorkloadEvictedDueToPreempted", PREEMPTED, sigterm)
    ended["status"]["phase"] = "Failed"
    assert termination(ended) == (143, f"preempted by Kueue: {PREEMPTED}")


@pytest.mark.parametrize(
    ("reason", "message", "said"),
    [
        (
            "WorkloadEvictedDueToPodsReadyTimeout",
            "Exceeded the PodsReady timeout default/pod-x",
            "evicted by Kueue (PodsReadyTimeout): Exceeded the PodsReady timeout default/pod-x",
        ),
        (
            "WorkloadEvictedDueToClusterQueueStopped",
            "The ClusterQueue is stopped",
            "evicted by Kueue (ClusterQueueStopped): The ClusterQueue is stopped",
        ),
        ("WorkloadDeleted", "Workload is deleted", "stopped by Kueue (WorkloadDeleted): Workload is deleted"),
        ("NotAdmitted", "", "stopped by Kueue (NotAdmitted)"),
    ],
)
def test_other_stops_by_kueue_say_its_reason(reason: str, message: str, said: str) -> None:
    assert stopped_by_kueue(stopped(reason, message)) == said


def test_a_pod_kueue_did_not_stop_ends_with_its_own_reason() -> None:
    running = stopped("WorkloadEvictedDueToPreempted")
    running["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "x"}]
    assert stopped_by_kueue(running) is None
    withdrawn = stopped("WorkloadEvictedDueToPreempted")
    withdrawn["status"]["conditions"][1]["status"] = "False"
    assert stopped_by_kueue(withdrawn) is None
    oom = {"name": "kernel", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    plain = {"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [oom]}}
    assert termination(plain) == (137, "OOMKilled (exit code 137)")


def event(
    reason: str, message: str, uid: str = "u-1", component: str = "pod-kueue-controller"
) -> dict[str, Any]:
    """A core/v1 event on pod ``uid`` as Kueue's recorder (or another) writes it."""
    return {
        "involvedObject": {"kind": "Pod", "name": "gpushare-kernel-k", "uid": uid},
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "reportingComponent": component,
    }


def test_a_preempted_pod_that_is_gone_is_told_by_kueues_event() -> None:
    """Kueue deletes the pod it preempted; its event on the pod stays."""
    scheduled = event(
        "Scheduled", "Successfully assigned ns/gpushare-kernel-k to gpu-node-1", component="default-scheduler"
    )
    killing = event("Killing", "Stopping container kernel", component="kubelet")
    events = [scheduled, event("Stopped", PREEMPTED), killing]
    assert stopped_in_events(events, "u-1") == f"preempted by Kueue: {PREEMPTED}"
    timeout = event("Stopped", "Exceeded the PodsReady timeout ns/pod-gpushare-kernel-k-1a2b3")
    assert stopped_in_events([timeout], "u-1") == (
        "stopped by Kueue: Exceeded the PodsReady timeout ns/pod-gpushare-kernel-k-1a2b3"
    )
    # An earlier pod of the same name (the kernel's previous one), or someone else's "Stopped".
    assert stopped_in_events([event("Stopped", PREEMPTED, uid="u-0")], "u-1") is None
    assert stopped_in_events([event("Stopped", "bye", component="kubelet")], "u-1") is None
    assert stopped_in_events([scheduled, killing], "u-1") is None


def test_the_brokers_start_of_a_held_pod_says_kueues_reason() -> None:
    """The broker follows its pods through its watch and reads their Workloads once a round:
    the start says Kueue's reason as a server's own start does."""
    times = {"unschedulable_grace": 10.0, "launch_timeout": 300.0}
    waiting = progress(
        gated(), "gpushare-kernel-k", waited=5.0, unschedulable_for=0.0, kueue_says=NO_QUOTA, **times
    )
    assert (waiting.state, waiting.unschedulable) == ("starting", False)
    assert waiting.detail == f"pending: queued by Kueue in LocalQueue gpu: {NO_QUOTA}"


def test_one_workload_list_serves_every_held_pod_by_its_uid() -> None:
    assert workloads_selector(["u-2", "u-1", "u-2"]) == "kueue.x-k8s.io/job-uid in (u-1,u-2)"
    no_quota = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": NO_QUOTA}

    def of(uid: str | None, *conditions: dict[str, Any]) -> dict[str, Any]:
        made = workload(*conditions)
        made["metadata"]["labels"] = {JOB_UID_LABEL: uid} if uid else {}
        return made

    workloads = [of("u-1", no_quota), of("u-2"), of(None, no_quota)]
    assert why_waiting_by_pod(workloads) == {"u-1": NO_QUOTA}  # u-2 says nothing yet
