"""The cluster's GPU nodes and our kernel pods, kept current by list + watch.

A server on the Kubernetes backend shows the cluster as its pool. Listing nodes on every request
would cost an API call per panel refresh; instead one thread per kind lists once, then watches
from that list's ``resourceVersion`` and applies each event, re-listing when the watch expires
(410 Gone) or breaks. Readers get a copy of the latest state at no API cost, and ``version``
changes whenever anything did, the view's problem included (the server's render cache keys on it).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, unreachable
from jupyter_gpushare.backends.kubernetes.objects.manifests import APP, APP_LABEL

log = logging.getLogger("jupyter_gpushare")

WATCH_SECONDS = 240  # a watch request's server-side timeout; the thread watches again after it
RETRY_SECONDS = 2.0  # pause after a failed list or watch before trying again

ListCall = Callable[..., Any]


def raw_events(list_call: ListCall) -> ListCall:
    """``list_call`` for ``kubernetes.watch.Watch.stream`` with events as JSON only. The watch
    builds the generated client's model of each object for a call whose signature or docstring
    names one — about 1 ms a kernel pod's event, whose JSON parses in 0.04 ms, which a burst of
    starts paid under the interpreter lock; for a call that names none it keeps the JSON (its
    ``raw_object``, ERROR events and 410 Gone handled as before)."""

    def unnamed(**options: Any) -> Any:
        return list_call(**options)

    return unnamed


class Watched:
    """Objects of one kind, kept current by a daemon thread (list, then watch from there)."""

    def __init__(
        self,
        kind: str,
        list_call: ListCall,
        on_change: Callable[[], None],
        *,
        label_selector: str | None = None,
        hint: str = "",
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.kind = kind
        self._list_call = list_call
        self._on_change = on_change
        self._selector = label_selector
        self._hint = hint  # added to a 401/403: which permission is missing
        self._retry = retry_seconds
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self.synced = threading.Event()  # set once the first list arrived
        self.version = 0  # moves with every change of these objects (a reader's cache key)
        self.problem: str | None = None  # why the view may be stale (None while current)
        self._thread = threading.Thread(target=self._run, name=f"gpushare-watch-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by name, without copying the others."""
        with self._lock:
            return self._objects.get((namespace, name))

    def versioned_items(self) -> tuple[int, list[dict[str, Any]]]:
        """The objects and the version they are at, read together."""
        with self._lock:
            return self.version, list(self._objects.values())

    # ---- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list()
                self._follow(version)
            except ApiException as error:
                self._failed(self._describe(error), expired=error.status == 410)
            except (HTTPError, OSError, ValueError) as error:
                self._failed(f"cannot reach the Kubernetes API to watch {self.kind}: {unreachable(error)}")

    def _options(self) -> dict[str, Any]:
        return {"label_selector": self._selector} if self._selector else {}

    def _list(self) -> str:
        response = self._list_call(**self._options(), _preload_content=False)
        listed = json.loads(response.data or b"{}")
        objects = {_key(item): item for item in listed.get("items") or []}
        with self._lock:
            self._objects = objects
            self.version += 1
        if self.problem:
            log.info("Watching %s again", self.kind)
        self.problem = None
        self.synced.set()
        self._on_change()
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> None:
        """Apply watch events until the watch ends (timeout, stop) or fails (raises)."""

        list_call = raw_events(self._list_call)
        while not self._stop.is_set():
            self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
            for event in self._watch.stream(  # type: ignore[no-untyped-call]
                list_call,
                **self._options(),
                resource_version=version,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + 10,
            ):
                if self._stop.is_set():
                    return
                if not isinstance(event, dict):
                    continue  # a keep-alive blank line
                kind, raw = event.get("type"), event.get("raw_object") or {}
                version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._objects.pop(_key(raw), None)
                    else:
                        self._objects[_key(raw)] = raw
                    self.version += 1
                self._on_change()

    def _failed(self, problem: str, expired: bool = False) -> None:
        if expired:  # the watch's version is too old (compacted away): list again at once
            log.info("Watching %s: its version is gone (410 Gone); listing again", self.kind)
            return
        if problem != self.problem:
            log.warning("GPU pool view: %s (retrying every %g s)", problem, self._retry)
            self.problem = problem
            # The view now carries a problem (the panel's banner): a change for every cache
            # keyed on the version, as the objects' own changes are.
            self._on_change()
        self._stop.wait(self._retry)

    def _describe(self, error: ApiException) -> str:
        try:
            message = str(json.loads(error.body or "{}").get("message") or error.reason)
        except (TypeError, ValueError):
            message = str(error.reason)
        hint = f" ({self._hint})" if error.status in (401, 403) and self._hint else ""
        return f"the Kubernetes API refused to watch {self.kind}: {message}{hint}"


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


DRA_HINT = "reading the DRA pool needs the ClusterRole in examples/kubernetes/rbac-dra.yaml"


class ClusterWatch:
    """GPU nodes (cluster-wide) and kernel pods of jupyter-gpushare (in the namespace); with
    ``dra``, also ResourceSlices, ResourceClaims (every namespace: others' claims occupy the
    devices too) and DeviceClasses."""

    def __init__(
        self, cluster: Cluster, on_change: Callable[[], None] | None = None, *, dra: bool = False
    ) -> None:
        self.cluster = cluster
        self.version = 0  # changes with every change seen; a cheap "anything new?" for caches
        self._listeners = [on_change] if on_change else []
        core = cluster.core
        # Plain functions, not the client's methods: the watch then hands events over as the
        # API sent them (dicts) instead of converting every object into client models.
        self.nodes = Watched(
            "nodes",
            lambda **options: core.list_node(**options),
            self._changed,
            hint="listing nodes needs the ClusterRole in examples/kubernetes/rbac.yaml",
        )
        namespace = cluster.namespace
        self.pods = Watched(
            f"kernel pods in namespace {namespace}",
            lambda **options: core.list_namespaced_pod(namespace, **options),
            self._changed,
            label_selector=f"{APP_LABEL}={APP}",
            hint=f"the server's service account needs the Role in examples/kubernetes for {namespace}",
        )
        self.dra: tuple[Watched, Watched, Watched] | None = None
        if dra:
            resource = cluster.resource
            self.dra = (
                Watched(
                    "ResourceSlices",
                    lambda **o: resource.list_resource_slice(**o),
                    self._changed,
                    hint=DRA_HINT,
                ),
                Watched(
                    "ResourceClaims",
                    lambda **o: resource.list_resource_claim_for_all_namespaces(**o),
                    self._changed,
                    hint=DRA_HINT,
                ),
                Watched(
                    "DeviceClasses", lambda **o: resource.list_device_class(**o), self._changed, hint=DRA_HINT
                ),
            )

    @property
    def _all(self) -> list[Watched]:
        return [self.nodes, self.pods, *(self.dra or ())]

    @property
    def resource_slices(self) -> Watched | None:
        return self.dra[0] if self.dra else None

    @property
    def claims(self) -> Watched | None:
        return self.dra[1] if self.dra else None

    @property
    def device_classes(self) -> Watched | None:
        return self.dra[2] if self.dra else None

    def _changed(self) -> None:
        self.version += 1
        for listener in self._listeners:
            listener()

    def start(self) -> ClusterWatch:
        for watched in self._all:
            watched.start()
        return self

    def stop(self) -> None:
        for watched in self._all:
            watched.stop()

    def wait_synced(self, timeout: float) -> bool:
        return all(watched.synced.wait(timeout) for watched in self._all)

    @property
    def synced(self) -> bool:
        """Whether every kind has been listed once (``wait_synced`` would not wait)."""
        return all(watched.synced.is_set() for watched in self._all)

    @property
    def problem(self) -> str | None:
        problems = [watched.problem for watched in self._all if watched.problem]
        return "; ".join(problems) or None
