"""The kernel pods a server creates itself, with its own Kubernetes client: a
:class:`~.pod_keeper.PodKeeper`.

What kernel pods of one process share — the API client, the nodes' facts, the per-user quota
across starts, orphan collection — is the process's :class:`~.backend.KubernetesBackend`; this is
one kernel's pod. ``prepare`` collects this server's orphans (pods and Secrets whose creating
process is gone), builds the pod and its Secret (the connection file with the HMAC key and the
CurveZMQ keys, and the kernel's own-slice token) and holds the kernel's place in the user's
quota; ``launch`` creates Secret, pod and under DRA its ResourceClaim, and follows the start
(:mod:`.pod_start`); a failed start deletes them first, so nothing leaks.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend, kubernetes_backend
from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.connection_keys import ConnectionKeys
from jupyter_gpushare.backends.kubernetes.kernel_objects import (
    ClaimOf,
    create_claim,
    create_secret,
    delete_objects,
)
from jupyter_gpushare.backends.kubernetes.kueue_reads import stopped_by_kueue_events
from jupyter_gpushare.backends.kubernetes.objects.build import kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.claims import summary
from jupyter_gpushare.backends.kubernetes.objects.dialects import describe_request
from jupyter_gpushare.backends.kubernetes.objects.kueue import stopped_by_kueue
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    CONNECTION_FILE,
    HOLDER_ANNOTATION,
    claim_name,
    connection_info,
    kernel_ports,
    make_secret,
    pod_name,
    secret_name,
)
from jupyter_gpushare.backends.kubernetes.objects.status import termination
from jupyter_gpushare.backends.kubernetes.pod_keeper import KernelPod, PodEnd, PodWatch
from jupyter_gpushare.backends.kubernetes.pod_start import PodStart
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.pods.requests import PodRequest


class ClusterPods:
    """Kernel ``watch.kernel_id``'s pods, made by this server in its cluster."""

    def __init__(self, backend: KubernetesBackend, watch: PodWatch) -> None:
        self.backend = backend
        self.watch = watch
        self.pod = pod_name(watch.kernel_id)
        self._keys = ConnectionKeys()  # made at the first start, kept across restarts
        self._manifests: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._pod_request: PodRequest | None = None  # what the pod asks for (DRA: its claim's)
        self._size = ""  # the slice size as asked, for the claim's annotation
        self._claim: str | None = None  # the current pod's ResourceClaim (DRA presets)
        self._uid: str | None = None  # the current pod's, as created (its events name it)

    @classmethod
    async def open(cls, settings: GPUShare, watch: PodWatch) -> ClusterPods:
        return cls(await asyncio.to_thread(kubernetes_backend, settings), watch)

    def _start(self) -> PodStart:
        asked = summary(self._pod_request) if self._pod_request is not None else ""
        watch = self.watch
        return PodStart(
            self.backend.cluster,
            watch.kernel_id,
            self.pod,
            secret_name(watch.kernel_id),
            watch.say,
            watch.log,
            watch.poll_interval,
            watch.unschedulable_grace,
            claim=self._claim,
            asked=asked or None,
        )

    # ---- start ---------------------------------------------------------------------------------

    async def prepare(self, pod: KernelPod, checked: bool) -> None:
        # The pod's request is checked by the quota claim below, the server's check or not.
        backend = self.backend
        await asyncio.to_thread(backend.collect_orphans)
        pod_request = await self._build(pod)
        # Last, so nothing after it can fail and leave the claim behind (launch drops it).
        await asyncio.to_thread(backend.claim, pod.kernel_id, pod_request.memory or 0)

    async def rebuild(self, pod: KernelPod) -> None:
        await self._build(pod)

    async def _build(self, ask: KernelPod) -> PodRequest:
        """The Secret and pod of this kernel's slice as it stands (``self._manifests``)."""
        backend, settings = self.backend, self.backend.settings
        facts = await asyncio.to_thread(backend.facts)
        pod, pod_request = kernel_pod(
            settings,
            kernel_id=ask.kernel_id,
            server_id=backend.server_id,
            owner=backend.owner,
            request=ask.request,
            cluster=facts,
            argv=ask.argv,
            namespace=backend.cluster.namespace,
            annotations={HOLDER_ANNOTATION: backend.holder},
            report_url=backend.report_url(ask.kernel_id),
            kernel_env=dict(ask.env),
            ports=kernel_ports(ask.generation),
            generation=ask.generation,
        )
        self._pod_request, self._size = pod_request, str(ask.request.size)
        self._claim = claim_name(ask.kernel_id, ask.generation) if pod_request.claim is not None else None
        curve = self._keys.curve_for(settings.encrypt)
        secret = make_secret(
            ask.kernel_id,
            backend.server_id,
            backend.owner,
            backend.cluster.namespace,
            connection_info(kernel_ports(ask.generation), self._keys.key, ask.kernel_name, curve),
            ask.token,
            annotations={HOLDER_ANNOTATION: backend.holder},
        )
        self._manifests = (secret, pod)
        self.watch.log.info(
            "Kernel %s: pod %s in namespace %s asks for %s",
            ask.kernel_id,
            self.pod,
            backend.cluster.namespace,
            describe_request(pod_request) or "no GPU",
        )
        return pod_request

    async def launch(self, pod: KernelPod, timeout: float) -> dict[str, Any]:
        assert self._manifests is not None and self._pod_request is not None, "prepare first"
        secret, body = self._manifests
        start, backend = self._start(), self.backend
        holder = {HOLDER_ANNOTATION: backend.holder}
        try:
            await asyncio.to_thread(create_secret, backend.cluster, secret)
            created = await start.create_pod(body, time.monotonic() + timeout)
            self._uid = str(created["metadata"]["uid"])
            # Made once the pod exists, owned by it: it goes with the pod whatever happens.
            of = ClaimOf(pod.kernel_id, backend.server_id, backend.owner, self._size, pod.generation, holder)
            await asyncio.to_thread(create_claim, backend.cluster, self._pod_request, created, of)
            ip = await start.wait_running(timeout)
            await start.say_allocated()
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._delete_objects))
            raise
        finally:
            backend.unclaim(pod.kernel_id)  # the pod, or nothing, counts from now on
        info: dict[str, Any] = json.loads(secret["stringData"][CONNECTION_FILE])
        info["ip"] = ip
        return info

    def new_pod(self) -> object:
        return self.backend.new_pod(self.watch.kernel_id)

    def check(self, memory: object, mode: object, cores: object) -> object:
        return self.backend.check(memory, mode, cores, self.watch.kernel_id)

    # ---- running -------------------------------------------------------------------------------

    async def look(self) -> PodEnd | None:
        try:
            pod = await asyncio.to_thread(self.backend.cluster.read_pod, self.pod)
        except ClusterError as error:
            self.watch.log.warning(
                "Kernel %s: cannot read its pod (taken as running): %s", self.watch.kernel_id, error
            )
            return None
        if pod is None:
            return PodEnd(await self._kueue_stopped() or "the kernel pod was deleted by someone else")
        phase = (pod.get("status") or {}).get("phase")
        # A pod Kueue stops (preempted) is deleted right after: its kernel ends now, with Kueue's
        # words, rather than as a pod gone for no known reason a moment later.
        if phase in ("Succeeded", "Failed") or stopped_by_kueue(pod) is not None:
            code, reason = termination(pod)
            output = await self._start().last_output() if code != 0 else ""
            return PodEnd(reason, code, output)
        return None

    async def _kueue_stopped(self) -> str | None:
        """Why Kueue stopped the pod, where it did, from its event: a pod Kueue preempts goes
        within seconds, between two looks of the kernel's restarter."""
        uid = self._uid
        if uid is None:  # a kernel taken over after a server restart: which pod was it?
            return None
        try:
            return await asyncio.to_thread(stopped_by_kueue_events, self.backend.cluster, self.pod, uid)
        except ClusterError as error:
            self.watch.log.debug("Kernel %s: cannot read its pod's events: %s", self.watch.kernel_id, error)
            return None

    async def delete_pod(self, grace_period_seconds: int | None) -> None:
        await asyncio.to_thread(self.backend.cluster.delete_pod, self.pod, grace_period_seconds)

    async def remove(self) -> None:
        self.backend.unclaim(self.watch.kernel_id)
        await asyncio.to_thread(self._delete_objects)

    def _delete_objects(self) -> None:
        """Pod (at once), Secret and the current claim; the claim would go with its pod anyway
        (it is owned by it), deleting it here frees its devices without waiting for the garbage
        collector."""
        cluster, claim = self.backend.cluster, self._claim
        claims = (lambda: cluster.delete_claim(claim)) if claim is not None else None
        for problem in delete_objects(cluster, self.watch.kernel_id, 0, claims):
            self.watch.log.error("Kernel %s: cleanup incomplete: %s", self.watch.kernel_id, problem)

    def describe(self) -> dict[str, Any]:
        return {"namespace": self.backend.namespace, "secret": secret_name(self.watch.kernel_id)}


__all__ = ["ClusterPods"]
