"""What Kueue says about kernel pods, read from the API: why a Workload waits, where it stands in
Kueue's queues, why a pod was stopped. Shared by whoever makes the pods — a server itself (:mod:`.pod_start`,
:mod:`.cluster_pods`) or the GPU broker (:mod:`.broker.pods`); the reading of the objects is
:mod:`~jupyter_gpushare.backends.kubernetes.objects.kueue`'s (pure).

Blocking: callers in an event loop run these in a thread.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError
from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    VERSIONS,
    Place,
    places_by_pod,
    stopped_in_events,
)
from jupyter_gpushare.backends.kubernetes.objects.kueue_wait import Quota, quota_of

# The API server's words for a path nothing serves (a LocalQueue it serves but does not have is
# another 404: "localqueues.kueue.x-k8s.io \"gpu\" not found").
NOT_SERVED = "the server could not find the requested resource"


class KueueReader:
    """One reader of a Kueue API (a kernel's start, the broker): the versions Kueue serves are
    tried newest first and the one found is kept; ``label`` begins what it logs (which kernel,
    or none)."""

    def __init__(
        self, cluster: Cluster, log: logging.Logger | logging.LoggerAdapter[Any], label: str = ""
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.label = label
        self.versions: tuple[str, ...] = VERSIONS  # the API versions left to try

    @property
    def readable(self) -> bool:
        """False once it cannot be read at all here (not served, or forbidden)."""
        return bool(self.versions)


class WorkloadReader(KueueReader):
    """Kueue's Workloads in the kernels' namespace: a Role without ``list workloads`` is said
    once and not asked again — the reader falls back to the plain sentence."""

    def list(self, selector: str) -> list[dict[str, Any]] | None:
        """The Workloads matching ``selector``; None when they cannot be read (an API error now,
        logged at debug; or ever: not :attr:`readable`)."""
        while self.versions:
            version = self.versions[0]
            try:
                return self.cluster.list_workloads(selector, version)
            except ClusterError as error:
                if error.api_status == 404:  # not served here (an older Kueue serves v1beta1 only)
                    self.versions = self.versions[1:]
                    continue
                if error.api_status in (401, 403):
                    self.versions = ()  # asking again would not help
                    self.log.warning("%sKueue's reason is not shown: %s", self.label, error)
                    return None
                self.log.debug("%scannot read Kueue's Workloads: %s", self.label, error)
                return None
        return None


class PlaceReader(KueueReader):
    """Where kernel pods wait in Kueue's queues, from its visibility API (a LocalQueue's pending
    workloads: one request for every pod waiting there). Where no visibility API is served
    (Kueue's VisibilityOnDemand off, or an older Kueue) or the Role lacks ``get
    localqueues/pendingworkloads``, that is said once and not asked again: starts say Kueue's
    reason without a position."""

    def places(self, local_queue: str) -> dict[str, Place] | None:
        """The :class:`Place` of each pod waiting in ``local_queue``, by the pod's uid; None
        when they cannot be read (now: logged at debug; or ever: not :attr:`readable`)."""
        while self.versions:
            version = self.versions[0]
            try:
                return places_by_pod(self.cluster.pending_workloads(local_queue, version))
            except ClusterError as error:
                if error.api_status == 404 and NOT_SERVED in str(error):
                    self.versions = self.versions[1:]
                    if not self.versions:
                        self.log.info(
                            "%sKueue's visibility API is not served (Kueue's VisibilityOnDemand): "
                            "positions in its queues are not shown",
                            self.label,
                        )
                    continue
                if error.api_status in (401, 403):
                    self.versions = ()
                    self.log.warning("%sthe position in Kueue's queue is not shown: %s", self.label, error)
                    return None
                self.log.debug("%scannot read Kueue's pending workloads: %s", self.label, error)
                return None
        return None


class QuotaReader(KueueReader):
    """The quota of the ClusterQueue a LocalQueue feeds (:mod:`.objects.kueue_wait`), for the wait
    estimate: the LocalQueue is read once (its ClusterQueue never changes), the ClusterQueue each
    time (what it reserves does). Where the Role lacks ``get localqueues`` or the ClusterRole ``get
    clusterqueues``, that is said once and not asked again: starts show no estimate."""

    def __init__(
        self, cluster: Cluster, log: logging.Logger | logging.LoggerAdapter[Any], label: str = ""
    ) -> None:
        super().__init__(cluster, log, label)
        self.feeds: dict[str, str] = {}  # LocalQueue → its ClusterQueue

    def quota(self, local_queue: str) -> Quota | None:
        """The quota behind ``local_queue``; None when it cannot be read (now: logged at debug;
        or ever: not :attr:`readable`)."""
        while self.versions:
            version = self.versions[0]
            try:
                name = self.feeds.get(local_queue)
                if name is None:
                    spec = self.cluster.local_queue(local_queue, version).get("spec") or {}
                    name = self.feeds[local_queue] = str(spec.get("clusterQueue") or "")
                return quota_of(self.cluster.cluster_queue(name, version)) if name else None
            except ClusterError as error:
                if error.api_status == 404 and NOT_SERVED in str(error):
                    self.versions = self.versions[1:]
                    continue
                if error.api_status in (401, 403):
                    self.versions = ()
                    self.log.warning("%sno wait estimate for Kueue's queues: %s", self.label, error)
                    return None
                self.log.debug("%scannot read Kueue's quota: %s", self.label, error)
                return None
        return None


def stopped_by_kueue_events(cluster: Cluster, pod: str, uid: str) -> str | None:
    """Why Kueue stopped pod ``pod`` of ``uid`` (an earlier pod of the same name is not it), from
    the event Kueue recorded on it: a pod Kueue preempts is deleted within seconds, its events
    outlive it (raises :class:`~jupyter_gpushare.backends.kubernetes.cluster.cluster.ClusterError`)."""
    return stopped_in_events(cluster.pod_events(pod), uid)


__all__ = ["KueueReader", "PlaceReader", "QuotaReader", "WorkloadReader", "stopped_by_kueue_events"]
