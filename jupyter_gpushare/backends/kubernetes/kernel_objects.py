"""A kernel pod's objects in the cluster besides the pod — its Secret and, under a DRA preset, its
ResourceClaim — created and deleted the same way whoever makes the pod: a server itself
(:mod:`.cluster_pods`) or the GPU broker (:mod:`.broker.pods`).

The claim is built by the pure
:func:`~jupyter_gpushare.backends.kubernetes.objects.build.kernel_claim` once its pod exists and is
owned by it, so it goes with the pod; deleting it with the pod frees its devices without waiting for
the garbage collector.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError
from jupyter_gpushare.backends.kubernetes.objects.build import kernel_claim
from jupyter_gpushare.backends.kubernetes.objects.kueue import QUEUE_LABEL
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    APP,
    APP_LABEL,
    KERNEL_ID_LABEL,
    label_value,
    pod_name,
    secret_name,
)
from jupyter_gpushare.core.pods.requests import PodRequest


def create_secret(cluster: Cluster, body: dict[str, Any]) -> None:
    """Create a kernel's Secret; one of ours left by a start that did not finish is replaced."""
    try:
        cluster.create_secret(body)
    except ClusterError as error:
        if error.api_status != 409:
            raise
        cluster.delete_secret(str(body["metadata"]["name"]))
        cluster.create_secret(body)


@dataclass(frozen=True)
class ClaimOf:
    """Whose claim it is: the kernel's, for the server and user that asked for its pod."""

    kernel_id: str
    server_id: str
    owner: str
    size: str  # the slice size as asked, for the claim's annotation
    generation: int  # each pod of the kernel has a claim of its own
    annotations: Mapping[str, str]


def create_claim(cluster: Cluster, request: PodRequest, pod: Mapping[str, Any], of: ClaimOf) -> None:
    """Create the claim of ``pod`` (just created: its uid makes it the claim's owner); one of ours
    left by a start that did not finish is replaced. Nothing without a DRA preset."""
    metadata = pod.get("metadata") or {}
    claim = kernel_claim(
        request,
        kernel_id=of.kernel_id,
        server_id=of.server_id,
        owner=of.owner,
        namespace=cluster.namespace,
        size=of.size,
        annotations=of.annotations,
        generation=of.generation,
        pod={"name": pod_name(of.kernel_id), "uid": str(metadata.get("uid") or "")},
        queue=(metadata.get("labels") or {}).get(QUEUE_LABEL),  # the pod's LocalQueue, if any
    )
    if claim is None:
        return
    try:
        cluster.create_claim(claim)
    except ClusterError as error:
        if error.api_status != 409:
            raise
        cluster.delete_claim(claim["metadata"]["name"])
        cluster.create_claim(claim)


def delete_claims(cluster: Cluster, kernel_id: str) -> None:
    """Delete every claim of kernel ``kernel_id``'s pods (by label: a restart's pods each have
    their own)."""
    mine = f"{APP_LABEL}={APP},{KERNEL_ID_LABEL}={label_value(kernel_id)}"
    for claim in cluster.list_claims(mine):
        cluster.delete_claim(str(claim["metadata"]["name"]))


def delete_objects(
    cluster: Cluster,
    kernel_id: str,
    grace: int | None,
    delete_claims: Callable[[], object] | None = None,
) -> list[str]:
    """Delete a kernel's pod (after ``grace`` seconds; None: the pod's own), its Secret and, with
    ``delete_claims``, its claims, whatever state they are in (blocking). What could not be
    deleted, as sentences: one failure does not keep the others."""
    deletions: list[Callable[[], object]] = [
        lambda: cluster.delete_pod(pod_name(kernel_id), grace_period_seconds=grace),
        lambda: cluster.delete_secret(secret_name(kernel_id)),
    ]
    if delete_claims is not None:
        deletions.append(delete_claims)
    problems = []
    for delete in deletions:
        try:
            delete()
        except ClusterError as error:
            problems.append(str(error))
    return problems


__all__ = ["ClaimOf", "create_claim", "create_secret", "delete_claims", "delete_objects"]
