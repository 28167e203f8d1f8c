"""The cluster's pool read once (``jupyter gpushare status`` on the Kubernetes backend).

A server keeps the same view current by list + watch (:mod:`jupyter_gpushare.server.cluster_pool`);
a command needs it only once, so it lists nodes and kernel pods and builds the same JSON.
"""

from __future__ import annotations

from typing import Any

from ..config import GPUShare
from .cluster import Cluster, ClusterError, load_configuration
from .manifests import APP, APP_LABEL
from .pool import kernel_view, pool_view, read_node, read_pod
from .presets import resolve_preset


def cluster_status(settings: GPUShare) -> dict[str, Any]:
    """``{"pool", "kernels"}`` of every kernel pod in the namespace (others' anonymous)."""
    viewer = settings.effective_owner()
    preset = resolve_preset(settings.resource_preset, settings.resource_names)
    found = load_configuration()
    cluster = Cluster(settings.namespace or found.namespace, configuration=found.configuration)
    problem = None
    try:
        listed_nodes = cluster.list_nodes()
    except ClusterError as error:  # nodes need a ClusterRole; the pods alone still say a lot
        listed_nodes, problem = [], str(error)
    try:
        listed_pods = cluster.list_pods(f"{APP_LABEL}={APP}")
    finally:
        cluster.close()
    nodes = sorted((n for n in (read_node(node, preset) for node in listed_nodes) if n), key=lambda n: n.name)
    slices = sorted((s for s in map(read_pod, listed_pods) if s), key=lambda s: s.created)
    return {
        "pool": pool_view(nodes, slices, preset, {}, viewer=viewer, problem=problem),
        "kernels": [
            kernel_view(item, nodes, slices, None, viewer=viewer) for item in slices if not item.ended
        ],
    }
