"""One kernel pod start's cluster objects: built from what a server asks, created, deleted.

:class:`~.pods.PodStarts` decides when (limits, the queue, admission, following the pod through
the watch); this module is what a start is and what it costs the API. :func:`new_start` builds the
pod and its Secret (the connection file with fresh keys, the kernel's token) — and under a DRA
preset the claim's spec — without a request; :func:`create_objects` makes them once the start is
admitted (Secret, pod, then the claim owned by the pod); :func:`delete_objects` removes them.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
from jupyter_gpushare.backends.kubernetes.connection_keys import new_curve_keypair
from jupyter_gpushare.backends.kubernetes.kernel_objects import (
    ClaimOf,
    create_claim,
    create_secret,
    delete_claims,
)
from jupyter_gpushare.backends.kubernetes.kernel_objects import delete_objects as delete_kernel_objects
from jupyter_gpushare.backends.kubernetes.objects.build import kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    CONNECTION_FILE,
    HOLDER_ANNOTATION,
    claim_name,
    connection_info,
    kernel_ports,
    make_secret,
)
from jupyter_gpushare.core.errors import GPUShareError
from jupyter_gpushare.core.pods.requests import PodRequest
from jupyter_gpushare.core.slice_request import make_slice_request

ACTIVE = ("queued", "creating", "starting")


@dataclass(frozen=True)
class PodAsk:
    """What a server asks for one kernel pod."""

    kernel_id: str
    memory: object
    mode: object
    cores: object
    argv: tuple[str, ...]
    env: Mapping[str, str]
    kernel_name: str
    report_url: str | None
    token: str
    generation: int
    key: str | None = None  # a restart keeps its kernel's keys
    curve: tuple[str, str] | None = None


@dataclass
class PodStartState:
    """One start, from the queue to a running pod (or its failure)."""

    kernel_id: str
    owner: str
    server_id: str
    memory: int | None  # bytes the pod asks for, where known
    secret: dict[str, Any]
    pod: dict[str, Any]
    pod_request: PodRequest | None = None  # under DRA: the claim's spec (kernel_claim makes it)
    size: str = ""  # the slice size as asked, for the claim's annotation
    generation: int = 0  # how many pods the kernel had before this one: its claim's name
    requested_at: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued, creating, starting, running, failed
    detail: str = ""
    error: GPUShareError | None = None
    admitted_at: float | None = None
    created_at: float | None = None  # when the pod's creation returned
    seen: bool = False  # the watch has shown the pod (so its absence now means deleted)
    unschedulable_since: float | None = None
    ip: str | None = None
    finished_at: float | None = None
    # The pod's resourceVersion and the time when the start was last followed: a round follows
    # it again when the pod changed, or once a second for its timers and Kueue's words.
    followed: tuple[str | None, float] | None = None

    @property
    def claim(self) -> str | None:
        """The name of this pod's ResourceClaim (None without a DRA preset)."""
        if self.pod_request is None or self.pod_request.claim is None:
            return None
        return claim_name(self.kernel_id, self.generation)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def new_start(backend: KubernetesBackend, owner: str, server_id: str, ask: PodAsk) -> PodStartState:
    """A queued start of ``ask``: its pod and Secret built, nothing sent to the API (raises
    :class:`~jupyter_gpushare.core.errors.InvalidRequestError` for a request that makes no slice)."""
    settings = backend.settings
    request = make_slice_request(
        ask.memory,
        ask.mode,
        ask.cores,
        settings.default_memory,
        settings.default_mode,
        settings.min_memory_bytes(),
    )
    key = ask.key or secrets.token_hex(32)
    curve = ask.curve if settings.encrypt else None
    if settings.encrypt and curve is None:
        curve = new_curve_keypair()
    ports = kernel_ports(ask.generation)
    namespace = backend.cluster.namespace
    pod, pod_request = kernel_pod(
        settings,
        kernel_id=ask.kernel_id,
        server_id=server_id,
        owner=owner,
        request=request,
        cluster=backend.facts(),
        argv=ask.argv,
        namespace=namespace,
        annotations={HOLDER_ANNOTATION: backend.holder},
        report_url=ask.report_url,
        kernel_env=ask.env,
        ports=ports,
        generation=ask.generation,  # under DRA the pod refers to its own claim
    )
    secret = make_secret(
        ask.kernel_id,
        server_id,
        owner,
        namespace,
        connection_info(ports, key, ask.kernel_name, curve),
        ask.token,
        annotations={HOLDER_ANNOTATION: backend.holder},
    )
    return PodStartState(
        ask.kernel_id,
        owner,
        server_id,
        pod_request.memory,
        secret,
        pod,
        pod_request=pod_request,
        size=str(request.size),
        generation=ask.generation,
    )


def create_objects(backend: KubernetesBackend, start: PodStartState) -> None:
    """The Secret, the pod and under DRA its claim, in that order (raises
    :class:`~jupyter_gpushare.backends.kubernetes.cluster.cluster.ClusterError`). A Secret left by
    an earlier pod of the kernel is replaced."""
    cluster = backend.cluster
    create_secret(cluster, start.secret)
    created = cluster.create_pod(start.pod)
    if start.pod_request is not None:
        # Made once the pod exists, owned by it: it goes with the pod whatever happens.
        holder = {HOLDER_ANNOTATION: backend.holder}
        of = ClaimOf(start.kernel_id, start.server_id, start.owner, start.size, start.generation, holder)
        create_claim(cluster, start.pod_request, created, of)


def delete_objects(backend: KubernetesBackend, kernel_id: str, grace: int | None) -> list[str]:
    """Delete a kernel's pod and Secret and, under DRA, its ResourceClaims (they would go with
    their pod anyway, being owned by it; deleting them here frees the devices at once). What
    could not be deleted, as sentences."""
    cluster = backend.cluster
    claims = (lambda: delete_claims(cluster, kernel_id)) if backend.preset.dra is not None else None
    return delete_kernel_objects(cluster, kernel_id, grace, claims)


def connection_of(start: PodStartState) -> dict[str, Any]:
    """The connection info a server gets for a running start: the Secret's, with the pod's IP."""
    info: dict[str, Any] = json.loads(start.secret["stringData"][CONNECTION_FILE])
    info["ip"] = start.ip
    return info


__all__ = [
    "ACTIVE",
    "PodAsk",
    "PodStartState",
    "connection_of",
    "create_objects",
    "delete_objects",
    "new_start",
]
