"""A Kubernetes cluster for tests: an API server and a node, all on loopback, no cluster needed.

* :class:`ApiServer` is kmock's ``KubernetesEmulator`` (a real HTTP server) extended to keep the
  real API's semantics for what the backend uses — as shipped it ignores label selectors and
  answers 500 where the API answers 404. Here: label and field selectors on lists and watches,
  ``Status`` objects with the API's reasons (404 ``NotFound``, 409 ``AlreadyExists``, 400
  ``BadRequest``), object metadata (uid, resourceVersion, creationTimestamp), Secrets' stringData
  stored as base64 ``data``, and graceful pod deletion (a running pod gets a deletionTimestamp
  and goes once its node has stopped it; grace 0 deletes at once).
* :class:`Node` plays scheduler and kubelet for a few simulated GPU nodes: it binds pods that
  fit the nodes' allocatable resources (or posts ``FailedScheduling`` with the scheduler's
  wording), "pulls" images (unknown ones fail with ``ErrImagePull``), materialises Secret and
  emptyDir volumes in a temp dir the way kubelet lays them out (``..data`` symlinks), runs the
  init and main containers' commands as local processes with the pod's environment (mount paths
  rewritten to the temp dirs), gives every pod its own loopback address (127.X.Y.2, .3, … in a
  subnet of the cluster's own) as
  pod IP — written into the materialised connection file in place of ``0.0.0.0``, the one liberty
  taken, since pods on one host cannot each own the fixed kernel ports — and reports phase,
  container states and events. Deleting a pod stops its process. A test can OOM-kill or evict a
  pod. Any write into a (read-only in a real cluster) Secret volume is recorded as a violation.
* :class:`SimulatedCluster` runs both on their own event loop in a thread (as a real API server is
  another process) and writes a kubeconfig pointing at it.

Dynamic Resource Allocation (ResourceSlices, ResourceClaims, claim allocation) is in k8s_dra.py,
hooked in through ``Node(dra=...)``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
import yaml
from kmock import KubernetesError

T = TypeVar("T")

PODS = kmock.resource("", "v1", "pods")
SECRETS = kmock.resource("", "v1", "secrets")
EVENTS = kmock.resource("", "v1", "events")
NODES = kmock.resource("", "v1", "nodes")
KINDS = {PODS: "Pod", SECRETS: "Secret", EVENTS: "Event", NODES: "Node"}
NAMESPACED = {PODS, SECRETS, EVENTS}
# Kinds whose DELETE answers with the object (the others answer with a Status).
DELETE_ANSWERS_OBJECT = {PODS}

# Fields each kind can be selected on (the API refuses others with 400).
FIELDS = {
    PODS: {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName", "status.phase"},
    SECRETS: {"metadata.name", "metadata.namespace", "type"},
    EVENTS: {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.fieldPath",
        "reason",
        "type",
        "source",
    },
    NODES: {"metadata.name", "spec.unschedulable"},
}


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status_error(
    code: int, reason: str, message: str, name: str | None = None, kind: str | None = None
) -> KubernetesError:
    details = {"name": name, "kind": kind} if name else {}
    return KubernetesError(status=code, reason=reason, message=message, details=details)


# ---- selectors --------------------------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"^\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$"
)


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def label_matcher(text: str) -> Callable[[dict[str, str]], bool]:
    """The API's label selector syntax: ``a=b``, ``a==b``, ``a!=b``, ``a in (b,c)``,
    ``a notin (b)``, ``a``, ``!a``; requirements are ANDed."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for part in _split(text):
        match = _REQUIREMENT.match(part)
        if not match or (match.group("not") and match.group("op")):
            raise status_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        key, op, value = match.group("key"), (match.group("op") or "").strip(), match.group("value")
        if not op:
            absent = bool(match.group("not"))
            checks.append(lambda labels, k=key, a=absent: (k in labels) != a)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        else:
            if not value or not value.startswith("("):
                raise status_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
            values = {item.strip() for item in value[1:-1].split(",")}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
    return lambda labels: all(check(labels) for check in checks)


def field_matcher(text: str, resource: kmock.resource) -> Callable[[dict[str, Any]], bool]:
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split(text):
        match = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not match:
            raise status_error(400, "BadRequest", f"invalid field selector: {part!r}")
        path, op, value = match.groups()
        if path not in FIELDS[resource]:
            raise status_error(400, "BadRequest", f"field label not supported: {path}")

        def get(obj: dict[str, Any], path: str = path) -> str:
            current: Any = obj
            for step in path.split("."):
                current = (current or {}).get(step) if isinstance(current, dict) else None
            if isinstance(current, dict) and path == "source":
                current = current.get("component")
            return "" if current is None else str(current)

        if op == "!=":
            checks.append(lambda obj, g=get, v=value: g(obj) != v)
        else:
            checks.append(lambda obj, g=get, v=value: g(obj) == v)
    return lambda obj: all(check(obj) for check in checks)


# ---- the API server ---------------------------------------------------------------------------


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the real API's semantics for pods, Secrets, events and nodes."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    logs: dict[str, Path] = attrs.field(factory=dict, init=False)  # pod name -> its container's output
    # Every pod a client created through the API, as it was created (deleted ones too).
    created_pods: list[dict[str, Any]] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # The API groups, also where the official client asks for them (with a trailing slash).
        self.fallback["get /apis/"] << self._serve_apis
        for resource, kind in KINDS.items():
            self.resources[resource] = {
                "kind": kind,
                "namespaced": resource in NAMESPACED,
                "verbs": ["create", "delete", "get", "list", "patch", "watch"],
            }

    # Every request for our kinds is answered here, before kmock's own (storage-only) logic.
    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource == PODS and request.subresource == "log" and request.action == kmock.action.FETCH:
            return self._log(request)
        if resource not in KINDS or request.subresource or request.action is None:
            return await super()._handle(request)
        action = request.action
        if action == kmock.action.WATCH:
            return await super()._handle(request)  # _serve_watch below applies the selectors
        async with self._lock:
            if action == kmock.action.LIST:
                return aiohttp.web.json_response(self._list(request))
            if action == kmock.action.FETCH:
                return aiohttp.web.json_response(self._fetch(resource, request.namespace, request.name))
            if action == kmock.action.CREATE:
                return aiohttp.web.json_response(await self._create(request), status=201)
            if action == kmock.action.DELETE:
                return aiohttp.web.json_response(await self._delete(request))
            if action == kmock.action.UPDATE:
                return aiohttp.web.json_response(await self._patch(request))
        return await super()._handle(request)

    def _log(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        name = request.name or ""
        self._fetch(PODS, request.namespace, name)  # 404 for a pod that does not exist
        path = self.logs.get(name)
        if path is None or not path.exists():
            raise status_error(400, "BadRequest", f'container "kernel" in pod "{name}" is waiting to start')
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        tail = int(request.params.get("tailLines", len(lines)) or len(lines))
        return aiohttp.web.Response(text="".join(lines[-tail:] if tail else []))

    # -- storage helpers (call with the lock held) --

    def _key(self, resource: kmock.resource, namespace: str | None, name: str | None) -> tuple[Any, ...]:
        return (resource, namespace if resource in NAMESPACED else None, name)

    def get(self, resource: kmock.resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self._key(resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(dict(self._objects[key].raw))

    def items(self, resource: kmock.resource) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(dict(obj.raw))
            for (kind, _, _), obj in list(self._objects.items())
            if kind == resource and not obj.deleted
        ]

    async def store(self, resource: kmock.resource, raw: dict[str, Any], event: str = "MODIFIED") -> None:
        metadata = raw["metadata"]
        metadata["resourceVersion"] = str(next(self._versions))
        key = self._key(resource, metadata.get("namespace"), metadata["name"])
        if key not in self._objects:
            self._objects[key] = raw
        else:
            self._objects[key].create(raw)  # a new version of the object
        await self._buses[resource].put({"type": event, "object": copy.deepcopy(raw)})

    async def remove(
        self, resource: kmock.resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        key = self._key(resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        raw = copy.deepcopy(dict(self._objects[key].raw))
        self._objects[key].delete()
        await self._buses[resource].put({"type": "DELETED", "object": raw})
        return raw

    async def add(self, resource: kmock.resource, raw: dict[str, Any]) -> dict[str, Any]:
        """Create an object as the API does (for the node's events and the tests' fixtures)."""
        raw = copy.deepcopy(raw)
        metadata = raw.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name, namespace = metadata.get("name"), metadata.get("namespace")
        plural = resource.plural
        if not name:
            raise status_error(422, "Invalid", f"{KINDS[resource]} is invalid: metadata.name: Required value")
        if self.get(resource, namespace, name) is not None:
            raise status_error(409, "AlreadyExists", f'{plural} "{name}" already exists', name, plural)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", now())
        if resource == SECRETS:
            data = dict(raw.get("data") or {})
            for key, value in (raw.pop("stringData", None) or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            raw["data"] = data
            raw.setdefault("type", "Opaque")
        if resource == PODS:
            spec = raw.setdefault("spec", {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("restartPolicy", "Always")
            raw["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        await self.store(resource, raw, "ADDED")
        return raw

    # -- verbs --

    def _list(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None
        labels = label_matcher(request.params.get("labelSelector", ""))
        fields = field_matcher(request.params.get("fieldSelector", ""), resource)
        items = [
            obj
            for obj in self.items(resource)
            if (request.namespace is None or obj["metadata"].get("namespace") == request.namespace)
            and labels(obj["metadata"].get("labels") or {})
            and fields(obj)
        ]
        return {
            "kind": f"{KINDS[resource]}List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "items": items,
        }

    def _fetch(self, resource: kmock.resource, namespace: str | None, name: str | None) -> dict[str, Any]:
        found = self.get(resource, namespace, name or "")
        if found is None:
            raise status_error(
                404, "NotFound", f'{resource.plural} "{name}" not found', name, resource.plural
            )
        return found

    async def _create(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise status_error(400, "BadRequest", "the body of the request was in an unknown format")
        metadata = body.setdefault("metadata", {})
        if request.namespace is not None:
            if metadata.get("namespace") not in (None, request.namespace):
                raise status_error(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            metadata["namespace"] = request.namespace
        created = await self.add(resource, body)
        if resource == PODS:
            self.created_pods.append(copy.deepcopy(created))
        return created

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None and request.name is not None
        found = self._fetch(resource, request.namespace, request.name)
        options = request.data if isinstance(request.data, dict) else {}
        grace_text = request.params.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        if resource == PODS:
            spec, status = found.get("spec") or {}, found.get("status") or {}
            grace = (
                int(grace_text)
                if grace_text is not None
                else int(spec.get("terminationGracePeriodSeconds", 30))
            )
            running = spec.get("nodeName") and status.get("phase") not in ("Succeeded", "Failed")
            if running and grace > 0:
                # Graceful: marked now, gone once the node has stopped the containers.
                metadata = found["metadata"]
                if not metadata.get("deletionTimestamp") or grace < int(
                    metadata.get("deletionGracePeriodSeconds", grace)
                ):
                    deadline = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=grace)
                    metadata["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
                    metadata["deletionGracePeriodSeconds"] = grace
                    await self.store(resource, found)
                return found
            await self.remove(resource, request.namespace, request.name)
            return found
        await self.remove(resource, request.namespace, request.name)
        if resource in DELETE_ANSWERS_OBJECT:
            return found
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": request.name, "kind": resource.plural, "uid": found["metadata"].get("uid")},
        }

    async def _patch(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None and request.name is not None
        found = self._fetch(resource, request.namespace, request.name)
        key = self._key(resource, request.namespace, request.name)
        self._objects[key].patch(request.data or {})
        patched = copy.deepcopy(dict(self._objects[key].raw))
        patched["metadata"]["uid"] = found["metadata"]["uid"]
        await self.store(resource, patched)
        return patched

    async def _serve_watch(self, request: kmock.Request) -> Any:  # type: ignore[override]
        resource = request.resource
        assert resource is not None
        labels = label_matcher(request.params.get("labelSelector", ""))
        fields = field_matcher(request.params.get("fieldSelector", ""), resource)

        def wanted(obj: dict[str, Any]) -> bool:
            namespace_ok = request.namespace is None or obj["metadata"].get("namespace") == request.namespace
            return bool(namespace_ok and labels(obj["metadata"].get("labels") or {}) and fields(obj))

        yield b""
        async with self._lock:
            existing = [obj for obj in self.items(resource) if wanted(obj)]
        for obj in existing:
            yield {"type": "ADDED", "object": obj}
        async for event in self._buses[resource]:
            if wanted(event.get("object") or {}):
                yield event


# ---- the node ---------------------------------------------------------------------------------


@dataclass
class SimNode:
    name: str
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name, **self.labels}},
            "status": {"allocatable": dict(self.allocatable), "capacity": dict(self.allocatable)},
        }


def hami_nodes(count: int = 4, gpumem_mib: int = 81920, card_mib: int = 81920) -> list[SimNode]:
    """``count`` nodes with one 80 GiB card each, as HAMi advertises them (10 vGPUs per card).

    ``gpumem_mib`` below ``card_mib``: part of each card's vGPU memory is promised elsewhere, so
    a slice can fit a card and still find no room (the scheduler says "Insufficient").
    """
    return [
        SimNode(
            f"gpu-node-{index}",
            {"nvidia.com/gpu": "10", "nvidia.com/gpumem": str(gpumem_mib), "nvidia.com/gpucores": "100"},
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": str(card_mib)},
        )
        for index in range(1, count + 1)
    ]


@dataclass
class Running:
    """A pod the node runs: its process, directories and what its Secret volumes held."""

    uid: str
    namespace: str
    name: str
    ip: str
    directory: Path
    process: asyncio.subprocess.Process | None = None
    secret_digests: dict[Path, str] = field(default_factory=dict)
    ended: bool = False
    stopping: bool = False
    log: Path | None = None


def _quantity(text: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 0.001, "k": 1000, "M": 10**6, "G": 10**9}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def pod_limits(pod: dict[str, Any]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
            totals[name] = totals.get(name, 0.0) + _quantity(str(value))
    return totals


class Node:
    """Scheduler and kubelet of a few simulated nodes, acting through the API server's store."""

    def __init__(
        self,
        api: ApiServer,
        nodes: list[SimNode],
        workdir: Path,
        *,
        schedulers: Iterable[str] = ("default-scheduler", "hami-scheduler"),
        broken_images: Iterable[str] = (),
        interval: float = 0.05,
        dra: Any = None,
    ) -> None:
        self.api = api
        self.dra = dra  # k8s_dra.DraSimulation: the DRA part of the scheduler, where there is one
        self.nodes = nodes
        self.workdir = workdir
        self.schedulers = set(schedulers)
        self.broken_images = set(broken_images)
        self.interval = interval
        self.running: dict[str, Running] = {}
        self.violations: list[str] = []
        self.logs: dict[str, Path] = {}  # pod name -> the kernel's stdout and stderr
        self._addresses = itertools.count(2)
        # A loopback subnet of this cluster's own (127.X.Y.0/24): two test runs on one machine
        # (the fixed kernel ports of pods) cannot collide.
        self._subnet = f"127.{random.randint(1, 254)}.{random.randint(0, 254)}"
        self._pull_failed: dict[str, float] = {}
        self._unschedulable: set[str] = set()

    async def run(self) -> None:
        async with self.api._lock:
            for node in self.nodes:
                await self.api.add(NODES, node.manifest())
        if self.dra is not None:
            await self.dra.publish(self.api)
        while True:
            try:
                await self.tick()
            except Exception as error:  # keep the node alive; the test sees the violation
                self.violations.append(f"node simulator error: {error!r}")
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        async with self.api._lock:
            pods = self.api.items(PODS)
        present = {pod["metadata"]["uid"] for pod in pods}
        if self.dra is not None:
            await self.dra.collect(self.api, pods)
        for uid, running in list(self.running.items()):
            if uid not in present:  # deleted at once (grace 0): kill and forget
                await self._stop(running, grace=0)
                self.running.pop(uid, None)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            if pod["metadata"].get("deletionTimestamp"):
                await self._terminate(pod)
            elif not spec.get("nodeName"):
                if spec.get("schedulerName", "default-scheduler") in self.schedulers:
                    await self._schedule(pod)
            elif uid not in self.running and status.get("phase") == "Pending":
                await self._start(pod)
            elif uid in self.running:
                await self._watch(pod, self.running[uid])

    # -- scheduler --

    async def _schedule(self, pod: dict[str, Any]) -> None:
        if self.dra is not None and not await self.dra.claims_ready(self.api, pod):
            return  # the scheduler waits until the pod's ResourceClaims exist
        async with self.api._lock:
            bound = [p for p in self.api.items(PODS) if (p.get("spec") or {}).get("nodeName")]
        wanted = pod_limits(pod)
        reasons: dict[str, int] = {}
        # Under DRA the scheduler prefers nodes where a claim's earlier firstAvailable entries fit.
        nodes = self.nodes if self.dra is None else await self.dra.rank_nodes(self.api, pod, self.nodes)
        for node in nodes:
            used: dict[str, float] = {}
            for other in bound:
                if other["spec"]["nodeName"] == node.name and other["status"].get("phase") not in (
                    "Succeeded",
                    "Failed",
                ):
                    for name, amount in pod_limits(other).items():
                        used[name] = used.get(name, 0.0) + amount
            short = [
                name
                for name, amount in sorted(wanted.items())
                if amount > _quantity(node.allocatable.get(name, "0")) - used.get(name, 0.0)
            ]
            if not short and (self.dra is None or await self.dra.allocate(self.api, pod, node.name)):
                await self._bind(pod, node)
                return
            reason = f"Insufficient {short[0]}" if short else "cannot allocate all claims"
            reasons[reason] = reasons.get(reason, 0) + 1
        summary = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        message = f"0/{len(self.nodes)} nodes are available: {summary}."
        name = pod["metadata"]["name"]
        if name in self._unschedulable:
            return
        self._unschedulable.add(name)
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], name)
            if current is None:
                return
            current["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": now(),
                }
            ]
            await self.api.store(PODS, current)
        await self.event(pod, "FailedScheduling", message, "Warning", "default-scheduler")

    async def _bind(self, pod: dict[str, Any], node: SimNode) -> None:
        self._unschedulable.discard(pod["metadata"]["name"])
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            if current is None:
                return
            current["spec"]["nodeName"] = node.name
            current["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
            ]
            await self.api.store(PODS, current)
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        await self.event(
            pod,
            "Scheduled",
            f"Successfully assigned {namespace}/{name} to {node.name}",
            "Normal",
            "default-scheduler",
        )

    # -- kubelet --

    async def _start(self, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        images = [c["image"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
        broken = next((image for image in images if image in self.broken_images), None)
        if broken is not None:
            await self._pull_failure(pod, broken)
            return
        running = Running(
            metadata["uid"],
            metadata["namespace"],
            metadata["name"],
            f"{self._subnet}.{next(self._addresses)}",
            self.workdir / f"{metadata['name']}-{metadata['uid'][:8]}",
        )
        mounts_by_volume = await self._materialise(pod, running)
        if mounts_by_volume is None:
            return  # a Secret is missing: kubelet retries the mount
        self.running[running.uid] = running
        for container in spec.get("initContainers") or []:
            code = await self._run_to_end(container, mounts_by_volume, running)
            if code != 0:
                await self._finish(running, code, "Error", init=container["name"])
                return
        main = spec["containers"][0]
        command, env = self._rewrite(main, mounts_by_volume, running)
        running.log = self.logs[running.name] = self.api.logs[running.name] = running.directory / "kernel.log"
        with open(running.log, "wb") as log:
            running.process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                cwd=running.directory / "home",
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        for reason, message in (
            ("Pulled", f'Container image "{main["image"]}" already present on machine'),
            ("Created", f"Created container {main['name']}"),
            ("Started", f"Started container {main['name']}"),
        ):
            await self.event(pod, reason, message, "Normal", "kubelet")
        async with self.api._lock:
            current = self.api.get(PODS, running.namespace, running.name)
            if current is None:
                return
            started = now()
            current["status"].update(
                {
                    "phase": "Running",
                    "podIP": running.ip,
                    "podIPs": [{"ip": running.ip}],
                    "hostIP": "127.0.0.1",
                    "startTime": started,
                    "initContainerStatuses": [
                        {
                            "name": c["name"],
                            "image": c["image"],
                            "ready": True,
                            "restartCount": 0,
                            "state": {
                                "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": started}
                            },
                        }
                        for c in spec.get("initContainers") or []
                    ],
                    "containerStatuses": [
                        {
                            "name": main["name"],
                            "image": main["image"],
                            "ready": True,
                            "started": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": started}},
                        }
                    ],
                    "conditions": [
                        {"type": kind, "status": "True", "lastTransitionTime": started}
                        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                    ],
                }
            )
            await self.api.store(PODS, current)

    async def _pull_failure(self, pod: dict[str, Any], image: str) -> None:
        name = pod["metadata"]["name"]
        first = name not in self._pull_failed
        loop = asyncio.get_running_loop()
        since = self._pull_failed.setdefault(name, loop.time())
        reason = "ErrImagePull" if loop.time() - since < 1.0 else "ImagePullBackOff"
        message = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
            if reason == "ErrImagePull"
            else f'Back-off pulling image "{image}"'
        )
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], name)
            if current is None:
                return
            waiting = {"waiting": {"reason": reason, "message": message}}
            init = (current["spec"].get("initContainers") or [None])[0]
            target = init or current["spec"]["containers"][0]
            key = "initContainerStatuses" if init else "containerStatuses"
            old = ((current["status"].get(key) or [{}])[0].get("state") or {}).get("waiting") or {}
            if old.get("reason") == reason:
                return
            current["status"][key] = [
                {"name": target["name"], "image": image, "ready": False, "restartCount": 0, "state": waiting}
            ]
            await self.api.store(PODS, current)
        if first:
            await self.event(pod, "Pulling", f'Pulling image "{image}"', "Normal", "kubelet")
        await self.event(pod, "Failed", f'Failed to pull image "{image}": {message}', "Warning", "kubelet")

    async def _materialise(self, pod: dict[str, Any], running: Running) -> dict[str, Path] | None:
        """Volumes on disk, as kubelet lays them out; None while a Secret is missing."""
        (running.directory / "home").mkdir(parents=True, exist_ok=True)
        volumes: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            target = running.directory / "volumes" / volume["name"]
            if "secret" in volume:
                async with self.api._lock:
                    secret = self.api.get(SECRETS, running.namespace, volume["secret"]["secretName"])
                if secret is None:
                    await self.event(
                        pod,
                        "FailedMount",
                        f'MountVolume.SetUp failed for volume "{volume["name"]}" : secret '
                        f'"{volume["secret"]["secretName"]}" not found',
                        "Warning",
                        "kubelet",
                    )
                    shutil.rmtree(running.directory, ignore_errors=True)
                    return None
                files = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
                if "connection.json" in files:
                    info = json.loads(files["connection.json"])
                    if info.get("ip") == "0.0.0.0":  # the pod's own address on this shared host
                        info["ip"] = running.ip
                        files["connection.json"] = json.dumps(info).encode()
                data = target / "..2025_01_01_00_00_00.000000000"
                data.mkdir(parents=True)
                for key, content in files.items():
                    (data / key).write_bytes(content)
                    (data / key).chmod(int(volume["secret"].get("defaultMode", 0o644)))
                    running.secret_digests[target / key] = hashlib.sha256(content).hexdigest()
                (target / "..data").symlink_to(data.name)
                for key in files:
                    (target / key).symlink_to(f"..data/{key}")
            else:  # emptyDir (and anything else: an empty directory)
                target.mkdir(parents=True)
            volumes[volume["name"]] = target
        return volumes

    def _rewrite(
        self, container: dict[str, Any], volumes: dict[str, Path], running: Running
    ) -> tuple[list[str], dict[str, str]]:
        """The container's command and environment with mount paths pointing at the volumes."""
        mounts = sorted(
            ((mount["mountPath"], volumes[mount["name"]]) for mount in container.get("volumeMounts") or []),
            key=lambda pair: -len(pair[0]),
        )

        def local(text: str) -> str:
            for path, directory in mounts:
                text = text.replace(path, str(directory))
            return text

        home = running.directory / "home"
        env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "JUPYTER_PLATFORM_DIRS": "1",
            "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
            "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"),
            "IPYTHONDIR": str(home / ".ipython"),
            "HOSTNAME": running.name,
        }
        for item in container.get("env") or []:
            env[item["name"]] = local(str(item.get("value", "")))
        # The image's entrypoint is taken to be empty: command, then args (KubeSpawner sets args).
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        return [local(part) for part in argv], env

    async def _run_to_end(self, container: dict[str, Any], volumes: dict[str, Path], running: Running) -> int:
        command, env = self._rewrite(container, volumes, running)
        process = await asyncio.create_subprocess_exec(*command, env=env, cwd=running.directory / "home")
        return await process.wait()

    async def _watch(self, pod: dict[str, Any], running: Running) -> None:
        if running.process is None or running.ended or running.stopping:
            return
        code = running.process.returncode
        if code is not None:
            await self._finish(running, code, "Completed" if code == 0 else "Error")

    async def _finish(
        self, running: Running, code: int, reason: str, *, init: str | None = None, message: str = ""
    ) -> None:
        """The container ended on its own (or was OOM-killed): the pod's final status."""
        running.ended = True
        self._check_secrets(running)
        async with self.api._lock:
            current = self.api.get(PODS, running.namespace, running.name)
            if current is None:
                return
            finished = now()
            terminated = {"exitCode": code, "reason": reason, "finishedAt": finished}
            if message:
                terminated["message"] = message
            key = "initContainerStatuses" if init else "containerStatuses"
            name = init or current["spec"]["containers"][0]["name"]
            current["status"][key] = [
                {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": terminated}}
            ]
            current["status"]["phase"] = "Succeeded" if code == 0 and not init else "Failed"
            current["status"]["conditions"] = [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": finished}
            ]
            await self.api.store(PODS, current)

    async def _terminate(self, pod: dict[str, Any]) -> None:
        """A pod marked for deletion: stop its containers within the grace period, then let the
        API forget it."""
        running = self.running.get(pod["metadata"]["uid"])
        if running is not None and not running.stopping:
            grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            await self._stop(running, grace=min(grace, 5))
        if running is not None:
            self.running.pop(running.uid, None)
        async with self.api._lock:
            await self.api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _stop(self, running: Running, grace: float) -> None:
        running.stopping = True
        process = running.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            try:
                await asyncio.wait_for(process.wait(), timeout=max(grace, 0.1))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        self._check_secrets(running)
        shutil.rmtree(running.directory / "volumes", ignore_errors=True)

    def _check_secrets(self, running: Running) -> None:
        for path, digest in running.secret_digests.items():
            if not path.is_symlink() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                self.violations.append(
                    f"pod {running.name} wrote into its read-only Secret volume: {path.name}"
                )
        running.secret_digests.clear()

    async def event(self, pod: dict[str, Any], reason: str, message: str, kind: str, component: str) -> None:
        metadata = pod["metadata"]
        stamp = now()
        async with self.api._lock:
            await self.api.add(
                EVENTS,
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
                    "involvedObject": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": metadata["name"],
                        "namespace": metadata["namespace"],
                        "uid": metadata["uid"],
                    },
                    "reason": reason,
                    "message": message,
                    "type": kind,
                    "count": 1,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "source": {"component": component},
                    "reportingComponent": component,
                },
            )

    # -- what a test does to a node --

    async def oom_kill(self, name: str) -> None:
        running = next(r for r in self.running.values() if r.name == name)
        assert running.process is not None
        running.stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signal.SIGKILL)
        await running.process.wait()
        await self._finish(running, 137, "OOMKilled")

    async def shutdown(self) -> None:
        for running in list(self.running.values()):
            await self._stop(running, grace=0)
        self.running.clear()


# ---- in a thread --------------------------------------------------------------------------------


class SimulatedCluster:
    """API server and node on their own event loop in a thread; a kubeconfig pointing at them."""

    def __init__(
        self, root: Path, namespace: str = "kernels", nodes: list[SimNode] | None = None, **node_options: Any
    ) -> None:
        self.root = root
        self.namespace = namespace
        self._nodes = nodes if nodes is not None else hami_nodes()
        self._node_options = node_options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="k8s-sim", daemon=True)
        self._stack: contextlib.AsyncExitStack | None = None
        self._node_task: asyncio.Task[None] | None = None
        self.api: ApiServer
        self.node: Node
        self.url = ""
        self.kubeconfig = root / "kubeconfig"

    def __enter__(self) -> SimulatedCluster:
        self._thread.start()
        self.call(self._start)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "test-token"}}],
                    "contexts": [
                        {
                            "name": "sim",
                            "context": {"cluster": "sim", "user": "tester", "namespace": self.namespace},
                        }
                    ],
                    "current-context": "sim",
                }
            )
        )
        return self

    async def _start(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.api = await self._stack.enter_async_context(ApiServer())
        server = await self._stack.enter_async_context(kmock.Server(self.api))
        self.url = str(server.url).rstrip("/")
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        self.node = Node(self.api, self._nodes, self.root / "pods", **self._node_options)
        self._node_task = asyncio.create_task(self.node.run())

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _stop(self) -> None:
        if self._node_task is not None:
            self._node_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._node_task
        await self.node.shutdown()
        if self._stack is not None:
            await self._stack.aclose()

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)

    async def acall(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        """``call`` from a test's own event loop without blocking it."""
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    # -- reading the cluster as a test --

    def objects(self, resource: kmock.resource) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            async with self.api._lock:
                return self.api.items(resource)

        return self.call(read)

    def pods(self) -> list[dict[str, Any]]:
        return self.objects(PODS)

    def created_pods(self) -> list[dict[str, Any]]:
        """Every pod created through the API so far, the deleted ones too, oldest first."""

        async def read() -> list[dict[str, Any]]:
            async with self.api._lock:
                return copy.deepcopy(self.api.created_pods)

        return self.call(read)

    def secrets(self) -> list[dict[str, Any]]:
        return self.objects(SECRETS)

    def events(self, pod: str) -> list[dict[str, Any]]:
        return [event for event in self.objects(EVENTS) if event["involvedObject"]["name"] == pod]

    def add(self, resource: kmock.resource, raw: dict[str, Any]) -> dict[str, Any]:
        async def create() -> dict[str, Any]:
            async with self.api._lock:
                return await self.api.add(resource, raw)

        return self.call(create)

    def remove(self, resource: kmock.resource, namespace: str | None, name: str) -> None:
        async def delete() -> None:
            async with self.api._lock:
                await self.api.remove(resource, namespace, name)

        self.call(delete)

    @property
    def violations(self) -> list[str]:
        return list(self.node.violations)
