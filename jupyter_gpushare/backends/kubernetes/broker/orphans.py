"""Kernel pods nobody wants any more, and their Secrets: found and deleted by the broker.

A server asks after each of its kernel pods every few seconds (its poll, and a lease it renews),
so the broker knows which pods are wanted. One nobody has asked after for ``orphan_grace``
seconds is an orphan: its server is gone, or its start was lost when the broker was killed. It
is deleted with its Secret and, under DRA, its ResourceClaim (a claim is made after its pod and
owned by it, so none outlives its pod). A restarted broker gives every server that long to come
back before it collects anything. Secrets are listed now and then (they are not watched): one
whose kernel has no pod and no start in flight was left by a start killed between creating the
two.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    APP,
    APP_LABEL,
    KERNEL_ID_LABEL,
    label_value,
    pod_name,
)
from jupyter_gpushare.backends.kubernetes.objects.pool import read_pod

if TYPE_CHECKING:
    from jupyter_gpushare.backends.kubernetes.broker.pods import PodStarts

log = logging.getLogger("jupyter_gpushare.broker")


def collect_orphans(starts: PodStarts) -> list[str]:
    """Delete the orphans of ``starts``' namespace; what was deleted (``pod/…``, ``secret/…``)."""
    now = time.monotonic()
    if now - starts.started_at < starts.orphan_grace:
        return []  # servers have this long to come back to a restarted broker
    doomed: list[str] = []
    with starts.lock:
        pods = starts.pods()
        for pod in pods.values():
            item = read_pod(pod)
            if item is None or item.deleting:
                continue
            start = starts.starts.get(item.kernel_id)
            if start is not None and start.active:
                continue
            if now - starts.leases.get(item.kernel_id, starts.started_at) > starts.orphan_grace:
                doomed.append(item.kernel_id)
                starts.leases.pop(item.kernel_id, None)
                starts.starts.pop(item.kernel_id, None)
        with_pods = {item.kernel_id for item in map(read_pod, pods.values()) if item is not None}
        in_flight = {kernel_id for kernel_id, start in starts.starts.items() if start.active}
    for kernel_id in doomed:
        log.info(
            "Kernel %s: nobody has asked after its pod for %g s: deleting it and its Secret",
            kernel_id,
            starts.orphan_grace,
        )
        starts.delete_objects(kernel_id, 0)
    collected = [f"pod/{pod_name(kernel_id)}" for kernel_id in doomed]
    if now - starts.secrets_checked >= starts.orphan_grace:
        starts.secrets_checked = now
        collected += _collect_secrets(starts, (with_pods - set(doomed)) | in_flight)
    return collected


def _collect_secrets(starts: PodStarts, keep_kernels: set[str]) -> list[str]:
    cluster = starts.backend.cluster
    keep = {label_value(kernel_id) for kernel_id in keep_kernels}
    collected = []
    for secret in cluster.list_secrets(f"{APP_LABEL}={APP}"):
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get(KERNEL_ID_LABEL) in keep:
            continue
        name = str(secret["metadata"]["name"])
        try:
            cluster.delete_secret(name)
            collected.append(f"secret/{name}")
            log.info("Deleted the Secret %s: its kernel has no pod and no start in flight", name)
        except ClusterError as error:
            log.error("cannot delete the orphaned Secret %s: %s", name, error)
    return collected


__all__ = ["collect_orphans"]
