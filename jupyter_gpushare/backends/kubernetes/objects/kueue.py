"""Kernel pods queued by Kueue (``c.GPUShare.kueue_queue``), as Kueue's plain-pod integration
reads and writes them. Pure.

A pod labelled with a LocalQueue's name (:data:`QUEUE_LABEL`) in a namespace Kueue manages gets
Kueue's scheduling gate (:data:`ADMISSION_GATE`) when it is created, and a Workload owned by it
(labelled :data:`JOB_UID_LABEL` = the pod's uid). While the gate is on, the scheduler does not
look at the pod: it waits for quota, not for a node, so a start counts it as queued (never as
unschedulable) and says why in Kueue's own words, the Workload's ``QuotaReserved=False`` message.
Kueue removes the gate when it admits the Workload; from then on the pod is scheduled as any other.

Kueue may take an admitted pod's quota back (preemption: a workload of higher priority, or a
ClusterQueue of the cohort reclaiming what another borrowed) or evict it for other reasons. It
then stops the pod as its plain-pod integration does: it first sets the pod's condition
:data:`STOP_CONDITION` (``TerminationTarget=True``, the reason ``WorkloadEvictedDueToPreempted``
and the Workload's ``Evicted`` message, "Preempted to accommodate a workload (UID: …) due to
reclamation within the cohort; …"), then deletes the pod, and records an event on it
(:data:`STOPPED_EVENT`, with the same message). :func:`stopped_by_kueue` reads the condition while
the pod is there, :func:`stopped_in_events` the event once it is gone (the events outlive it), so
the kernel's end says why in Kueue's words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.core.placement.wait_estimate import describe

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on a Workload: the uid of the pod it was made for
# The pod condition Kueue sets on a pod it stops, before deleting it (Kubernetes' own is
# DisruptionTarget); its reason is Kueue's StopReason, for an eviction "WorkloadEvictedDueTo" and
# the Workload's Evicted reason (Preempted, PodsReadyTimeout, ClusterQueueStopped…).
STOP_CONDITION = "TerminationTarget"
EVICTED_DUE_TO = "WorkloadEvictedDueTo"
STOPPED_EVENT = "Stopped"  # by Kueue's job controllers, "<framework>-kueue-controller" (pod-kueue-controller)
PREEMPTED = "Preempted"  # the Workload's Evicted reason, and how Kueue's preemption message begins
GROUP = "kueue.x-k8s.io"
WORKLOADS = "workloads"
LOCAL_QUEUES = "localqueues"
CLUSTER_QUEUES = "clusterqueues"
# Kueue's visibility API (its VisibilityOnDemand feature, an aggregated API server): a
# LocalQueue's pending workloads, each with its position there and in its ClusterQueue.
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
# Served by Kueue v0.15 and later (v1beta1 too, until a later release drops it); the conditions
# read here are the same in both.
VERSIONS = ("v1beta2", "v1beta1")


def queue_labels(queue: str | None) -> dict[str, str]:
    """The labels that put a pod in LocalQueue ``queue`` (none without one)."""
    return {QUEUE_LABEL: queue} if queue else {}


def held_by_kueue(pod: Mapping[str, Any]) -> str | None:
    """The LocalQueue of a pod Kueue holds behind its admission gate (None: not held)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    if not any(gate.get("name") == ADMISSION_GATE for gate in gates):
        return None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(QUEUE_LABEL) or "?")


def workload_selector(pod: dict[str, Any]) -> str | None:
    """The label selector of the Workload Kueue made for ``pod`` (None: the pod has no uid yet)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return f"{JOB_UID_LABEL}={uid}" if uid else None


def workloads_selector(uids: Iterable[str]) -> str:
    """The label selector of the Workloads Kueue made for the pods of ``uids``: one LIST for
    every pod a reader follows, not one per pod."""
    return f"{JOB_UID_LABEL} in ({','.join(sorted(set(uids)))})"


def why_waiting_by_pod(workloads: Sequence[dict[str, Any]]) -> dict[str, str]:
    """:func:`why_waiting` for each pod the Workloads were made for, by the pod's uid (a pod
    whose Workloads say nothing yet is left out)."""
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for workload in workloads:
        uid = ((workload.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL)
        if uid:
            by_pod.setdefault(str(uid), []).append(workload)
    said = {uid: why_waiting(found) for uid, found in by_pod.items()}
    return {uid: why for uid, why in said.items() if why is not None}


def why_waiting(workloads: Sequence[dict[str, Any]]) -> str | None:
    """Kueue's own sentence on why a pod's Workload is not admitted: its ``QuotaReserved=False``
    message ("couldn't assign flavors to pod set main: insufficient unused quota for
    nvidia.com/gpu in flavor default-flavor, 1 more needed"), else an ``Admitted=False`` one
    (quota reserved, admission checks pending); None when it says nothing yet."""
    for workload in workloads:
        conditions = {
            str(condition.get("type")): condition
            for condition in (workload.get("status") or {}).get("conditions") or []
        }
        for kind in ("QuotaReserved", "Admitted"):
            found = conditions.get(kind)
            if found is not None and found.get("status") == "False" and found.get("message"):
                return str(found["message"])
    return None


def stopped_by_kueue(pod: dict[str, Any]) -> str | None:
    """Why Kueue stopped ``pod``, in its words: ``preempted by Kueue: Preempted to accommodate a
    workload (UID: …) due to reclamation within the cohort; …``, ``evicted by Kueue
    (PodsReadyTimeout): …`` or ``stopped by Kueue (WorkloadDeleted): …``; None: Kueue did not
    stop it."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") != STOP_CONDITION or condition.get("status") != "True":
            continue
        reason = str(condition.get("reason") or "")
        message = str(condition.get("message") or "").strip()
        said = f": {message}" if message else ""
        cause = reason.removeprefix(EVICTED_DUE_TO)
        if cause == PREEMPTED:
            return f"preempted by Kueue{said}"
        if reason.startswith(EVICTED_DUE_TO):
            return f"evicted by Kueue ({cause}){said}"
        return f"stopped by Kueue ({reason or 'no reason given'}){said}"
    return None


def stopped_in_events(events: Sequence[dict[str, Any]], uid: str) -> str | None:
    """Why Kueue stopped the pod of ``uid``, from the event Kueue recorded on it (the pod itself
    may be gone): ``preempted by Kueue: Preempted to accommodate …`` or ``stopped by Kueue: …``
    (the event carries the message only); None: no such event."""
    for event in reversed(events):
        involved = event.get("involvedObject") or {}
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
        if involved.get("uid") != uid or event.get("reason") != STOPPED_EVENT or "kueue" not in source:
            continue
        message = str(event.get("message") or "").strip()
        if message.startswith(PREEMPTED):
            return f"preempted by Kueue: {message}"
        return f"stopped by Kueue: {message}" if message else "stopped by Kueue"
    return None


@dataclass(frozen=True)
class Place:
    """Where a pending Workload stands in Kueue's queues (1: next), as its visibility API says."""

    local: int  # in its LocalQueue
    cluster: int  # in its ClusterQueue (the LocalQueues of every namespace that feed it)
    waiting: int  # Workloads pending in the LocalQueue


def places_by_pod(pending: Sequence[dict[str, Any]]) -> dict[str, Place]:
    """Each pending Workload's :class:`Place`, by the uid of the pod it was made for (its owner)."""
    places: dict[str, Place] = {}
    for workload in pending:
        owners = (workload.get("metadata") or {}).get("ownerReferences") or []
        uid = next((str(o.get("uid")) for o in owners if o.get("kind") == "Pod" and o.get("uid")), None)
        local, cluster = workload.get("positionInLocalQueue"), workload.get("positionInClusterQueue")
        if uid is None or not isinstance(local, int) or not isinstance(cluster, int):
            continue
        places[uid] = Place(local + 1, cluster + 1, len(pending))
    return places


def queued_by_kueue(
    queue: str, why: str | None = None, place: Place | None = None, wait: float | None = None
) -> str:
    """Why a pod Kueue holds waits: ``queued by Kueue in LocalQueue gpu (position 2 of 3; 4 in
    its ClusterQueue; wait about 6 min): couldn't assign flavors …`` (without its place or an
    estimate of its ``wait`` in seconds, without those words; without Kueue's reason: ``…:
    waiting for its admission``)."""
    said: list[str] = []
    if place is not None:
        said.append(f"position {place.local} of {place.waiting}")
        if place.cluster != place.local:
            said.append(f"{place.cluster} in its ClusterQueue")
    if wait is not None:
        said.append(f"wait {describe(max(0.0, wait))}")
    where = f" ({'; '.join(said)})" if said else ""
    return f"queued by Kueue in LocalQueue {queue}{where}: {why or 'waiting for its admission'}"


def waiting_state(
    queue: str, why: str | None = None, place: Place | None = None, wait: float | None = None
) -> str:
    """What a start says while Kueue holds its pod: ``pending: queued by Kueue in LocalQueue
    gpu (position 2 of 3; wait about 6 min): couldn't assign flavors …``."""
    return f"pending: {queued_by_kueue(queue, why, place, wait)}"


__all__ = [
    "ADMISSION_GATE",
    "JOB_UID_LABEL",
    "QUEUE_LABEL",
    "VISIBILITY_GROUP",
    "Place",
    "held_by_kueue",
    "places_by_pod",
    "queue_labels",
    "queued_by_kueue",
    "stopped_by_kueue",
    "stopped_in_events",
    "waiting_state",
    "why_waiting",
    "why_waiting_by_pod",
    "workload_selector",
    "workloads_selector",
]
