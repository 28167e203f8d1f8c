"""The Kubernetes API over HTTPS as plain JSON: the test side's reads and writes (:class:`Api`)
and the simulated nodes' (:class:`AsyncApi`, with watches), each as one identity (a client
certificate or a bearer token).

Deliberately not the official client: the node side writes pod status, Leases, events and
ResourceSlices as kubelet and a DRA driver do, field by field, and the tests read objects as
the API serves them (dicts, every field the version has, none dropped by a client model).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml


@dataclass(frozen=True)
class Kind:
    """A resource the API serves: where it lives, and whether in a namespace."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        path = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


PODS = Kind("", "v1", "pods", "Pod")
SECRETS = Kind("", "v1", "secrets", "Secret")
EVENTS = Kind("", "v1", "events", "Event")
SERVICE_ACCOUNTS = Kind("", "v1", "serviceaccounts", "ServiceAccount")
CONFIG_MAPS = Kind("", "v1", "configmaps", "ConfigMap")
NODES = Kind("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Kind("", "v1", "namespaces", "Namespace", namespaced=False)
LEASES = Kind("coordination.k8s.io", "v1", "leases", "Lease")
ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Kind(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
RESOURCE_SLICES = Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False)
RESOURCE_CLAIMS = Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
RESOURCE_CLAIM_TEMPLATES = Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate")
DEVICE_CLASSES = Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
CUSTOM_RESOURCE_DEFINITIONS = Kind(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)
MUTATING_WEBHOOKS = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING_WEBHOOKS = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
# Kueue's (tests/cluster/kueue.py), in the version its documentation shows.
RESOURCE_FLAVORS = Kind("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)
CLUSTER_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
WORKLOADS = Kind("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
SERVICES = Kind("", "v1", "services", "Service")
ENDPOINTS = Kind("", "v1", "endpoints", "Endpoints")
ENDPOINT_SLICES = Kind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
API_SERVICES = Kind("apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False)

KINDS = {
    (kind.api_version, kind.kind): kind
    for kind in (
        PODS,
        SECRETS,
        EVENTS,
        SERVICE_ACCOUNTS,
        CONFIG_MAPS,
        NODES,
        NAMESPACES,
        LEASES,
        ROLES,
        ROLE_BINDINGS,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        RESOURCE_SLICES,
        RESOURCE_CLAIMS,
        RESOURCE_CLAIM_TEMPLATES,
        DEVICE_CLASSES,
        CUSTOM_RESOURCE_DEFINITIONS,
        MUTATING_WEBHOOKS,
        VALIDATING_WEBHOOKS,
        RESOURCE_FLAVORS,
        CLUSTER_QUEUES,
        LOCAL_QUEUES,
        WORKLOADS,
        SERVICES,
        ENDPOINTS,
        ENDPOINT_SLICES,
        API_SERVICES,
    )
}


def kind_of(manifest: Mapping[str, Any]) -> Kind:
    """The :class:`Kind` of a manifest (its apiVersion and kind)."""
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    if key not in KINDS:
        raise ValueError(f"tests/cluster/rest.py knows no {key[1]} of {key[0]}: add it to KINDS")
    return KINDS[key]


class ApiError(Exception):
    """An answer other than 2xx: its HTTP status, the ``Status``'s reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class Identity:
    """Who a client is: the API server's address and CA, and a client certificate or a token."""

    server: str
    ca: Path
    certificate: Path | None = None
    key: Path | None = None
    token: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.certificate is not None and self.key is not None:
            context.load_cert_chain(str(self.certificate), str(self.key))
        return context

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def identity_from_kubeconfig(path: Path, files: Path) -> Identity:
    """The identity of a kubeconfig such as kube-testcluster and :mod:`.controlplane` write (the
    CA, and certificate data or a token inline), with the CA, certificate and key written into
    ``files`` for TLS."""
    config = yaml.safe_load(path.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    files.mkdir(parents=True, exist_ok=True)
    ca = files / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    if "token" in user:
        return Identity(cluster["server"], ca, token=user["token"])
    certificate, key = files / "client.crt", files / "client.key"
    certificate.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.touch(mode=0o600)
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    return Identity(cluster["server"], ca, certificate, key)


PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


def _answer(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json() if response.content else None
    try:
        status = response.json()
        reason, message = status.get("reason", ""), status.get("message", response.text)
    except ValueError:
        reason, message = response.reason_phrase, response.text
    raise ApiError(response.status_code, reason, message)


def _query(
    label_selector: str = "", field_selector: str = "", **params: str | int | bool
) -> dict[str, str | int]:
    query: dict[str, str | int] = {
        key: ("true" if value is True else "false" if value is False else value)
        for key, value in params.items()
    }
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def _delete_body(grace: int | None, uid: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if grace is not None:
        body["gracePeriodSeconds"] = grace
    if uid is not None:
        body["preconditions"] = {"uid": uid}
    return body


class Api:
    """Synchronous reads and writes as one identity (the tests' side)."""

    def __init__(self, identity: Identity, timeout: float = 30.0) -> None:
        self.identity = identity
        self._client = httpx.Client(
            base_url=identity.server,
            verify=identity.ssl_context(),
            headers=identity.headers(),
            timeout=timeout,
        )

    def close(self) -> None:
        self._client.close()

    def request(self, method: str, path: str, **options: Any) -> Any:
        return _answer(self._client.request(method, path, **options))

    def text(self, path: str, **params: str | int) -> str:
        """A GET answered in plain text (``/readyz``, a pod's log)."""
        response = self._client.get(path, params=params)
        if not response.is_success:
            _answer(response)
        return response.text

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        try:
            found: dict[str, Any] = self.request("GET", kind.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        answer = self.request("GET", kind.path(namespace), params=_query(label_selector, field_selector))
        items: list[dict[str, Any]] = answer["items"]
        for item in items:  # a list's items carry no kind; an object read alone does
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    def create(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or (body.get("metadata") or {}).get("namespace")
        created: dict[str, Any] = self.request("POST", kind.path(namespace), json=dict(body))
        return created

    def patch(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str = "",
        patch_type: str = "merge",
    ) -> dict[str, Any]:
        patched: dict[str, Any] = self.request(
            "PATCH",
            kind.path(namespace, name, subresource),
            content=json.dumps(body),
            headers={"Content-Type": PATCH_TYPES[patch_type]},
        )
        return patched

    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        grace: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """Delete (``grace`` seconds; ``uid``: only that incarnation); False when it was gone."""
        try:
            self.request("DELETE", kind.path(namespace, name), json=_delete_body(grace, uid))
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def apply(self, manifest: Mapping[str, Any], field_manager: str = "gpushare-tests") -> dict[str, Any]:
        """Server-side apply (``kubectl apply --server-side --force-conflicts``)."""
        kind = kind_of(manifest)
        metadata = manifest["metadata"]
        applied: dict[str, Any] = self.request(
            "PATCH",
            kind.path(metadata.get("namespace"), metadata["name"]),
            params={"fieldManager": field_manager, "force": "true"},
            content=yaml.safe_dump(dict(manifest)),
            headers={"Content-Type": PATCH_TYPES["apply"]},
        )
        return applied


class AsyncApi:
    """The same as one identity from an event loop (the node side), with watches."""

    def __init__(self, identity: Identity, timeout: float = 30.0) -> None:
        self.identity = identity
        self._client = httpx.AsyncClient(
            base_url=identity.server,
            verify=identity.ssl_context(),
            headers=identity.headers(),
            timeout=timeout,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, **options: Any) -> Any:
        return _answer(await self._client.request(method, path, **options))

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.request("GET", kind.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    async def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> dict[str, Any]:
        """The whole list answer (its ``metadata.resourceVersion`` is where a watch goes on)."""
        answer: dict[str, Any] = await self.request(
            "GET", kind.path(namespace), params=_query(label_selector, field_selector)
        )
        return answer

    async def create(
        self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        namespace = namespace or (body.get("metadata") or {}).get("namespace")
        created: dict[str, Any] = await self.request("POST", kind.path(namespace), json=dict(body))
        return created

    async def replace(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
        metadata = body["metadata"]
        replaced: dict[str, Any] = await self.request(
            "PUT", kind.path(metadata.get("namespace"), metadata["name"]), json=dict(body)
        )
        return replaced

    async def patch(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str = "",
        patch_type: str = "merge",
    ) -> dict[str, Any]:
        patched: dict[str, Any] = await self.request(
            "PATCH",
            kind.path(namespace, name, subresource),
            content=json.dumps(body),
            headers={"Content-Type": PATCH_TYPES[patch_type]},
        )
        return patched

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        grace: int | None = None,
        uid: str | None = None,
    ) -> bool:
        try:
            await self.request(
                "DELETE", kind.path(namespace, name), content=json.dumps(_delete_body(grace, uid))
            )
        except ApiError as error:
            if error.status in (404, 409):  # gone, or another incarnation by that name
                return False
            raise
        return True

    async def apply(
        self, manifest: Mapping[str, Any], field_manager: str = "gpushare-tests"
    ) -> dict[str, Any]:
        """Server-side apply (``kubectl apply --server-side --force-conflicts``)."""
        kind = kind_of(manifest)
        metadata = manifest["metadata"]
        applied: dict[str, Any] = await self.request(
            "PATCH",
            kind.path(metadata.get("namespace"), metadata["name"]),
            params={"fieldManager": field_manager, "force": "true"},
            content=yaml.safe_dump(dict(manifest)),
            headers={"Content-Type": PATCH_TYPES["apply"]},
        )
        return applied

    async def watch(
        self,
        kind: Kind,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> AsyncIterator[dict[str, Any]]:
        """Events from ``resource_version`` on, until the API server ends the watch (its timeout,
        or ``410 Gone``: an ``ERROR`` event the caller answers by listing again)."""
        params = _query(
            label_selector,
            field_selector,
            watch=True,
            resourceVersion=resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=300,
        )
        timeout = httpx.Timeout(10.0, read=None)
        async with self._client.stream(
            "GET", kind.path(namespace), params=params, timeout=timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                _answer(response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)
