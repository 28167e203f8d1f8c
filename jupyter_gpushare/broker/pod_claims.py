"""The ResourceClaims of the broker's kernel pods, under a DRA preset.

:class:`~jupyter_gpushare.broker.pods.PodStarts` calls these: :func:`create_claim` right after it
creates an admitted start's pod (the claim is built by the same pure
:func:`~jupyter_gpushare.k8s.build.kernel_claim` as the embedded provisioner's, owned by the pod,
so it goes with it), and :func:`delete_claims` when it deletes a kernel's pod — at shutdown, for a
failed start, for an orphan — which frees the devices without waiting for the garbage collector.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..k8s.build import kernel_claim
from ..k8s.cluster import Cluster, ClusterError
from ..k8s.manifests import APP, APP_LABEL, KERNEL_ID_LABEL, label_value, pod_name
from ..k8s.requests import PodRequest


def create_claim(
    cluster: Cluster,
    request: PodRequest,
    pod: Mapping[str, Any],
    *,
    kernel_id: str,
    server_id: str,
    owner: str,
    size: str,
    generation: int,
    annotations: Mapping[str, str],
) -> None:
    """Create the claim of ``pod`` (just created: its uid makes it the claim's owner); one of ours
    left by a start that did not finish is replaced. Nothing without a DRA preset."""
    metadata = pod.get("metadata") or {}
    claim = kernel_claim(
        request,
        kernel_id=kernel_id,
        server_id=server_id,
        owner=owner,
        namespace=cluster.namespace,
        size=size,
        annotations=annotations,
        generation=generation,
        pod={"name": pod_name(kernel_id), "uid": str(metadata.get("uid") or "")},
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


__all__ = ["create_claim", "delete_claims"]
