"""From settings and a slice request to the exact pod the backend creates (pure).

``jupyter gpushare render-pod`` and the Kubernetes provisioner both call :func:`kernel_pod`, so
what the command prints is what a kernel start sends to the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.claims import make_claim
from jupyter_gpushare.backends.kubernetes.objects.dialects import kernel_request
from jupyter_gpushare.backends.kubernetes.objects.kueue import queue_labels
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    SERVER_ANNOTATION,
    SIZE_ANNOTATION,
    KernelPodSpec,
    claim_name,
    kernel_ports,
    labels,
    make_pod,
)
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.pods.requests import PodRequest
from jupyter_gpushare.core.slice_request import SliceRequest

DEFAULT_ARGV = ("python", "-m", "ipykernel_launcher", "-f", "{connection_file}")
DEFAULT_NAMESPACE = "default"

# Settings a kernel pod gets as JUPYTER_GPUSHARE_* so its %gpu follows its server's rules.
_FORWARDED = (
    "backend",  # the kind whose kernel handle %gpu uses (BackendKind.slice_handle)
    "default_memory",
    "default_mode",
    "over_limit_action",
    "idle_release_after",
    "idle_pod_restart",
    "sample_interval",
)


def cluster_facts(
    settings: GPUShare,
    mig_profiles: Sequence[str] = (),
    gpu_memory: int | None = None,
    consumable_capacity: bool = False,
) -> ClusterFacts:
    """What pod requests depend on: the preset, and what the nodes (or, under DRA, the
    ResourceSlices) advertise where known. ``consumable_capacity``: a ResourceSlice of the DRA
    driver offers devices that take several claims (used unless the setting says otherwise)."""
    dra_names = settings.dra_names()
    if consumable_capacity and settings.dra_consumable_capacity is None:
        dra_names["consumable_capacity"] = True
    return ClusterFacts(
        preset=resolve_preset(settings.resource_preset, settings.resource_names, dra_names),
        mig_profiles=tuple(mig_profiles) or tuple(settings.mig_profiles),
        gpu_memory=gpu_memory,
        gpu_type=settings.gpu_type or None,
        queue=settings.kai_queue or None,
        fallbacks=tuple(settings.dra_fallbacks),
    )


def namespace_of(settings: GPUShare, in_cluster_namespace: str | None = None) -> str:
    return settings.namespace or in_cluster_namespace or DEFAULT_NAMESPACE


def kernel_pod(
    settings: GPUShare,
    *,
    kernel_id: str,
    server_id: str,
    owner: str,
    request: SliceRequest,
    cluster: ClusterFacts,
    argv: Sequence[str] = DEFAULT_ARGV,
    namespace: str | None = None,
    annotations: Mapping[str, str] | None = None,
    report_url: str | None = None,
    kernel_env: Mapping[str, str] | None = None,
    ports: Mapping[str, int] | None = None,
    generation: int = 0,
) -> tuple[dict[str, Any], PodRequest]:
    """The kernel pod manifest and the pod request it carries; ``kernel_env`` is the kernelspec's
    ``env`` (ours wins where a name is both). Under a DRA preset the request carries a claim
    spec and the pod refers to the claim of its ``generation`` (:func:`kernel_claim` makes it)."""
    resources = kernel_request(request.mode.name, request.size, request.cores, cluster, request.card_at_least)
    env: dict[str, str] = {str(name): str(value) for name, value in (kernel_env or {}).items()}
    env[env_names.MODE] = request.mode.name
    for name in _FORWARDED:
        env[f"JUPYTER_GPUSHARE_{name.upper()}"] = str(getattr(settings, name))
    if report_url:
        env[env_names.REPORT_URL] = report_url  # where the kernel reports its GPU use
    spec = KernelPodSpec(
        kernel_id=kernel_id,
        server_id=server_id,
        owner=owner,
        namespace=namespace or namespace_of(settings),
        image=settings.kernel_image,
        argv=tuple(argv),
        request=resources,
        env=env,
        service_account=settings.service_account or None,
        node_selector=dict(settings.node_selector),
        tolerations=[dict(toleration) for toleration in settings.tolerations],
        scheduler_name=settings.scheduler_name or None,
        template=dict(settings.pod_template),
        annotations={**(annotations or {}), SIZE_ANNOTATION: request.size.text},
        ports=dict(ports or kernel_ports()),
        claim_name=claim_name(kernel_id, generation),
        labels=queue_labels(settings.kueue_queue),
    )
    return make_pod(spec), resources


def kernel_claim(
    request: PodRequest,
    *,
    kernel_id: str,
    server_id: str,
    owner: str,
    namespace: str,
    size: str,
    annotations: Mapping[str, str] | None = None,
    generation: int = 0,
    pod: Mapping[str, str] | None = None,
    queue: str | None = None,
) -> dict[str, Any] | None:
    """The ResourceClaim of a kernel's pod (None when the request carries no claim): labelled as
    its pod, so orphans are found the same way, and with ``queue`` put in the pod's Kueue
    LocalQueue as the pod is; with ``pod`` (name and uid) owned by it."""
    if request.claim is None:
        return None
    return make_claim(
        claim_name(kernel_id, generation),
        namespace,
        request.claim,
        labels={**labels(kernel_id, server_id, owner), **queue_labels(queue)},
        annotations={**(annotations or {}), SERVER_ANNOTATION: server_id, SIZE_ANNOTATION: size},
        owner=pod,
    )
