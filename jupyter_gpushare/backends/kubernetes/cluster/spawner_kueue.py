"""What Kueue says of a single-user server's pod while it waits for quota, told in its spawn's
progress: for KubeSpawner profiles that put GPU servers in a LocalQueue
(:func:`jupyter_gpushare.hub.gpu_profiles` with ``kueue_queue``).

KubeSpawner's progress (the hub's spawn page, ``/hub/api/users/{name}/server/progress``) shows the
events Kubernetes records on the server's pod; Kueue records its reasons on the pod's Workload,
and its queue positions only in its visibility API. So once the pod exists
(``after_pod_created_hook``) a task of the hub's reads, every ``EVERY`` seconds while Kueue's
gate holds the pod, the Workload's ``QuotaReserved=False`` message and the pod's place in its
LocalQueue, and records each change as a ``Normal`` event on the pod (``QueuedByKueue``, from
``jupyter-gpushare``) — which KubeSpawner's progress then shows, as ``kubectl describe pod``
does: ``Waiting for GPU quota: queued by Kueue in LocalQueue gpu (position 2 of 3): couldn't
assign flavors …``. The task ends when Kueue admits the pod, the pod goes, or the spawn's
``start_timeout`` passes.

The hub's service account needs, in the users' namespace, ``create events``, ``list
workloads.kueue.x-k8s.io`` and ``get localqueues/pendingworkloads`` in
``visibility.kueue.x-k8s.io`` (examples/kubernetes/rbac-hub-kueue.yaml); a read it may not make
leaves that part out of the sentence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.spawner_claims import Hook, configured_hook
from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    GROUP,
    VERSIONS,
    VISIBILITY_GROUP,
    WORKLOADS,
    Place,
    held_by_kueue,
    places_by_pod,
    queued_by_kueue,
    why_waiting,
    workload_selector,
)

log = logging.getLogger("jupyter_gpushare.hub")

EVERY = 2.0  # seconds between the hub's looks at a waiting server's Workload and place
REASON = "QueuedByKueue"
COMPONENT = "jupyter-gpushare"
SAID = "Waiting for GPU quota: "

# The hub's tasks telling waiting servers' progress (kept: a task nobody holds may be collected).
_telling: set[asyncio.Task[None]] = set()


def told_while_queued(inner: Callable[[Any], Hook] | None) -> Callable[[Any], Hook]:
    """A KubeSpawner ``after_pod_created_hook`` override (KubeSpawner calls it with the spawner):
    ``inner``'s hook for this spawn (a DRA claim's), else the one the admin configured, then
    the task that tells Kueue's words while the pod waits."""

    def hook_for(spawner: Any) -> Hook:
        then = inner(spawner) if inner is not None else configured_hook(spawner, "after_pod_created_hook")

        async def tell_kueues_words(spawner: Any, pod: Any) -> None:
            if then is not None:
                result = then(spawner, pod)
                if asyncio.iscoroutine(result):
                    await result
            metadata = pod.metadata if hasattr(pod, "metadata") else None
            name = metadata.name if metadata is not None else (pod.get("metadata") or {}).get("name")
            uid = metadata.uid if metadata is not None else (pod.get("metadata") or {}).get("uid")
            task = asyncio.get_running_loop().create_task(
                tell_while_queued(
                    spawner.api.api_client, spawner.namespace, str(name), str(uid), spawner.start_timeout
                )
            )
            _telling.add(task)
            task.add_done_callback(_ended)

        return tell_kueues_words

    return hook_for


def _ended(task: asyncio.Task[None]) -> None:
    _telling.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # The spawn goes on without Kueue's words: the hub's log says why.
        log.warning("Kueue's words on a server pod: stopped telling: %r", task.exception())


async def tell_while_queued(client: Any, namespace: str, pod_name: str, uid: str, timeout: float) -> None:
    """While Kueue's gate holds pod ``pod_name`` (of ``uid``), record each new sentence of
    Kueue's as an event on it (at most ``timeout`` seconds)."""
    from kubernetes_asyncio.client import CoreV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    core = CoreV1Api(client)
    reads = KueueReads(client, namespace)
    said: str | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(EVERY)
        try:
            pod = client.sanitize_for_serialization(await core.read_namespaced_pod(pod_name, namespace))
        except ApiException as error:
            if error.status != 404:
                log.debug("Server pod %s: cannot read it: %s", pod_name, error.reason)
                continue
            return  # gone
        except (OSError, asyncio.TimeoutError) as error:  # the API away a moment: look again
            log.debug("Server pod %s: cannot read it: %s", pod_name, error)
            continue
        if (pod.get("metadata") or {}).get("uid") != uid:
            return  # another pod of that name: another spawn's
        queue = held_by_kueue(pod)
        if queue is None:
            return  # admitted: the scheduler's events take over
        message = queued_by_kueue(queue, await reads.why(pod), await reads.place(queue, uid))
        if message == said:
            continue
        try:
            await core.create_namespaced_event(namespace, event_on(pod, SAID + message))  # type: ignore[arg-type]
        except ApiException as error:
            log.warning("Server pod %s: cannot record Kueue's words as an event: %s", pod_name, error.reason)
            return
        said = message


class KueueReads:
    """Kueue's Workload reason and visibility place for one server's pod, with the hub's client;
    a version not served is not asked again, a refusal stops that read."""

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.workload_versions = list(VERSIONS)
        self.place_versions = list(VERSIONS)

    async def why(self, pod: dict[str, Any]) -> str | None:
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        selector = workload_selector(pod)
        while selector is not None and self.workload_versions:
            try:
                listed = await CustomObjectsApi(self.client).list_namespaced_custom_object(
                    GROUP, self.workload_versions[0], self.namespace, WORKLOADS, label_selector=selector
                )
            except ApiException as error:
                if error.status == 404:
                    self.workload_versions.pop(0)
                    continue
                if error.status in (401, 403):
                    self.workload_versions.clear()
                return None
            return why_waiting(listed.get("items") or [])
        return None

    async def place(self, queue: str, uid: str) -> Place | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        while self.place_versions:
            version = self.place_versions[0]
            try:
                listed = await self.client.call_api(
                    f"/apis/{VISIBILITY_GROUP}/{version}/namespaces/{{namespace}}/localqueues/{{name}}"
                    "/pendingworkloads",
                    "GET",
                    path_params={"namespace": self.namespace, "name": queue},
                    header_params={"Accept": "application/json"},
                    response_types_map={200: "object"},  # by the int status in kubernetes_asyncio
                    auth_settings=["BearerToken"],
                    _return_http_data_only=True,
                )
            except ApiException as error:
                if error.status == 404 and "could not find the requested resource" in str(error.body or ""):
                    self.place_versions.pop(0)
                    continue
                if error.status in (401, 403):
                    self.place_versions.clear()
                return None
            return places_by_pod((listed or {}).get("items") or []).get(uid)
        return None


def event_on(pod: dict[str, Any], message: str) -> dict[str, Any]:
    """A ``Normal`` event on ``pod`` saying ``message`` (named as kubelet names its events)."""
    metadata = pod.get("metadata") or {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{metadata.get('name')}.{time.time_ns():x}",
            "namespace": metadata.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
        },
        "reason": REASON,
        "message": message,
        "type": "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


__all__ = ["REASON", "KueueReads", "event_on", "tell_while_queued", "told_while_queued"]
