"""The API server: kmock's ``KubernetesEmulator`` with the real API's semantics for what the
backend uses.

As shipped, the emulator is a real HTTP server that stores objects, but ignores label selectors
and answers 500 where the API answers 404. :class:`ApiServer` keeps the API's behaviour for pods,
Secrets, events and nodes: label and field selectors on lists and watches (selectors.py),
``Status`` objects with the API's reasons (404 ``NotFound``, 409 ``AlreadyExists``, 400
``BadRequest``, 422 ``Invalid``), object metadata (uid, resourceVersion, creationTimestamp),
Secrets' stringData stored as base64 ``data``, pod logs, and graceful pod deletion (a running pod
gets a deletionTimestamp and goes once its node has stopped it; grace 0 deletes at once). Made
with ``dra=True`` it also serves ``resource.k8s.io/v1`` (ResourceSlices, ResourceClaims,
ResourceClaimTemplates, DeviceClasses) the same way, as a Kubernetes 1.34 API server does.

The simulated node (node.py) reads and writes the same store through :meth:`ApiServer.get`,
:meth:`~ApiServer.items`, :meth:`~ApiServer.store`, :meth:`~ApiServer.add` and
:meth:`~ApiServer.remove`, holding the emulator's lock, as a controller would through the API.
"""

from __future__ import annotations

import base64
import copy
import datetime
import itertools
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock

from .resources import (
    DELETE_ANSWERS_OBJECT,
    DRA_KINDS,
    DRA_NAMESPACED,
    KINDS,
    NAMESPACED,
    PODS,
    SECRETS,
    now,
    status_error,
)
from .selectors import field_matcher, label_matcher


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the real API's semantics for pods, Secrets, events and nodes."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    logs: dict[str, Path] = attrs.field(factory=dict, init=False)  # pod name -> its container's output
    # Every pod a client created through the API, as it was created (deleted ones too).
    created_pods: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    dra: bool = False  # serve the resource.k8s.io/v1 kinds too
    kinds: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    namespaced: set[kmock.resource] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.kinds = {**KINDS, **(DRA_KINDS if self.dra else {})}
        self.namespaced = NAMESPACED | (DRA_NAMESPACED if self.dra else set())
        # The API groups, also where the official client asks for them (with a trailing slash).
        self.fallback["get /apis/"] << self._serve_apis
        for resource, kind in self.kinds.items():
            self.resources[resource] = {
                "kind": kind,
                "namespaced": resource in self.namespaced,
                "verbs": ["create", "delete", "get", "list", "patch", "watch"],
            }

    # Every request for our kinds is answered here, before kmock's own (storage-only) logic.
    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource == PODS and request.subresource == "log" and request.action == kmock.action.FETCH:
            return self._log(request)
        if resource not in self.kinds or request.subresource or request.action is None:
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
        return (resource, namespace if resource in self.namespaced else None, name)

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
            raise status_error(
                422, "Invalid", f"{self.kinds[resource]} is invalid: metadata.name: Required value"
            )
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
            "kind": f"{self.kinds[resource]}List",
            "apiVersion": f"{resource.group}/{resource.version}" if resource.group else resource.version,
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
