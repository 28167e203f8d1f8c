"""Which dialect a resource preset speaks: device-plugin resources or a DRA ResourceClaim. Pure.

Every caller that turns a slice request into what a pod asks for — the kernel pod builder, the
JupyterHub profiles, a broker — comes through :func:`kernel_request`, so a DRA preset reaches
every mode without a second code path, and each mode answers for itself in either dialect
(``Mode.pod_request``, ``Mode.dra_alternative``).
"""

from __future__ import annotations

from jupyter_gpushare.backends.kubernetes.objects.claims import claim_request, summary
from jupyter_gpushare.core.modes import get_mode
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.pods.requests import PodRequest, describe
from jupyter_gpushare.core.sizes import Size


def kernel_request(
    mode: str, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
) -> PodRequest:
    """What a pod holding a slice of ``size`` in ``mode`` asks the cluster for.

    ``card_at_least`` is the memory an exclusive card must have (the amount asked before an
    exclusive request became "whole"); only a DRA claim can select cards by it."""
    if cluster.preset.dra is not None:
        return claim_request(mode, size, cores, cluster, card_at_least)
    return get_mode(mode).pod_request(size, cores, cluster)


def describe_request(request: PodRequest) -> str:
    """One line for logs and the CLI, in either dialect."""
    return summary(request) or describe(request)
