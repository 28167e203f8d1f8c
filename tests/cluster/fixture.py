"""What a test holds of the real cluster: :class:`KubeCluster` (its namespace, its nodes, its
identities, and helpers to read and change objects), and :class:`Namespace` (a test module's
namespace with the shipped RBAC applied).

The pytest fixtures (tests/integration/conftest.py) start one :class:`~.controlplane.ControlPlane`
per session, a :class:`Namespace` per test module, and a :class:`KubeCluster` per test: the
test's nodes come and go with it, so every test sees only its own nodes ("0/4 nodes are
available"), and it leaves its namespace empty.

The helpers (``kubeconfig``, ``namespace``, ``pods()``, ``secrets()``, ``events(pod)``,
``objects(kind)``, ``add``, ``remove``, ``patch``, ``node.running``, ``node.oom_kill`` through
``acall``) are what the tests read and change; see docs/development.md.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from jupyter_gpushare.backends.kubernetes.cluster.cluster import event_time

from .controlplane import ControlPlane
from .dra_devices import DraDriver
from .node_side import NodeSide
from .nodes import SimNode, hami_nodes
from .real_node import RealNode
from .rest import (
    EVENTS,
    NAMESPACES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    SECRETS,
    Api,
    ApiError,
    Identity,
    Kind,
)

T = TypeVar("T")
REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples" / "kubernetes"
# Roles the tests need that a chart, not this project, ships (Zero to JupyterHub's hub).
TEST_RBAC = Path(__file__).resolve().parent / "rbac"
# The namespace the shipped RBAC names for kernel pods; a test module's namespace takes its place.
SHIPPED_KERNEL_NAMESPACE = "jupyter-kernels"
SERVER_NAMESPACE, SERVER_ACCOUNT = "jupyter", "jupyter-gpushare"  # the server's identity, as shipped
# Where each module's objects go, and what a test leaves behind that the next must not see.
CLEARED = (PODS, SECRETS, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, EVENTS)


def namespace_for(module: str) -> str:
    """A namespace name for a test module (``tests.integration.test_kubernetes`` → ``test-kubernetes``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", module.rsplit(".", 1)[-1].lower()).strip("-")
    return name[:63].rstrip("-") or "tests"


def shipped_rbac(
    namespace: str, files: Iterable[str] = ("rbac.yaml", "rbac-dra.yaml")
) -> list[dict[str, Any]]:
    """The example RBAC manifests as shipped, the kernels' namespace renamed to ``namespace``
    (what their comments tell an administrator to do)."""
    manifests = []
    for file in files:
        for document in yaml.safe_load_all((EXAMPLES / file).read_text()):
            if not document:
                continue
            text = yaml.safe_dump(document).replace(SHIPPED_KERNEL_NAMESPACE, namespace)
            manifests.append(yaml.safe_load(text))
    return manifests


class Namespace:
    """A test module's namespace, with the shipped RBAC applied to it."""

    def __init__(self, control_plane: ControlPlane, name: str) -> None:
        self.control_plane = control_plane
        self.name = name

    def create(self) -> Namespace:
        admin = self.control_plane.admin
        for namespace in (self.name, SERVER_NAMESPACE):  # rbac.yaml makes them too; here first
            if admin.get(NAMESPACES, namespace) is None:
                try:
                    admin.create(NAMESPACES, {"metadata": {"name": namespace}})
                except ApiError as error:
                    if error.status != 409:
                        raise
        for manifest in shipped_rbac(self.name):
            admin.apply(manifest)
        return self

    def delete(self) -> None:
        """Delete the namespace (the namespace controller empties it; nobody waits)."""
        self.control_plane.admin.delete(NAMESPACES, self.name)


class KubeCluster:
    """One test's view of the real cluster: the module's namespace, the test's nodes (a
    :class:`~.node_side.NodeSide`), and kubeconfigs.

    ``kubeconfig`` is the Jupyter server's identity as the shipped RBAC sets it up (the
    ServiceAccount ``jupyter/jupyter-gpushare``, a token from the TokenRequest API), with the
    test's namespace as its context's; ``admin_kubeconfig`` is the administrator's.
    ``real_node`` is the cluster's real node (:class:`~.real_node.RealNode`) when the test asked
    for one (``make_kube(real_node=True)``), else None: the simulated nodes stay every other
    test's, for their speed.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        namespace: str,
        root: Path,
        nodes: list[SimNode] | None = None,
        *,
        driver: DraDriver | None = None,
        broken_images: Iterable[str] = (),
        real_node: RealNode | None = None,
        **node_options: Any,
    ) -> None:
        self.control_plane = control_plane
        # The real node (kubelet, containerd, runc), when the test asked for it: it outlives
        # the test (one per machine, started once per module); its pods go with the namespace's.
        self.real_node = real_node
        self.namespace = namespace
        self.root = root
        self.url = control_plane.server
        self.admin: Api = control_plane.admin
        self.admin_kubeconfig = control_plane.admin_kubeconfig
        self.node = NodeSide(
            control_plane,
            nodes if nodes is not None else hami_nodes(),
            root / "nodes",
            driver=driver,
            broken_images=broken_images,
            record_namespace=namespace,
            **node_options,
        )
        self.kubeconfig = root / "kubeconfig"
        self._identities: dict[Path, Identity] = {}

    def __enter__(self) -> KubeCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.clear()
        self.node.start()
        self.kubeconfig_for_service_account(SERVER_NAMESPACE, SERVER_ACCOUNT, self.kubeconfig)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.clear()
        finally:
            self.node.stop()

    def clear(self, namespace: str | None = None) -> None:
        """Delete what tests leave in the test's namespace (or ``namespace``): pods at once,
        Secrets, claims, events."""
        namespace = namespace or self.namespace
        for kind in CLEARED:
            for item in self.admin.list(kind, namespace):
                self.admin.delete(kind, item["metadata"]["name"], namespace, grace=0)

    def apply(self, path: Path) -> None:
        """Apply a file of manifests as the administrator (``kubectl apply --server-side``)."""
        for manifest in yaml.safe_load_all(path.read_text()):
            if manifest:
                self.admin.apply(manifest)

    # -- identities -----------------------------------------------------------------------------

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, path: Path | None = None, context_namespace: str | None = None
    ) -> Path:
        """A kubeconfig acting as ServiceAccount ``namespace/name`` (made when missing) with a
        TokenRequest token; its context's namespace is the test's unless given."""
        token = self.control_plane.service_account_token(namespace, name)
        identity = Identity(self.url, self.control_plane.ca, token=token)
        path = path or self.root / "identities" / f"{namespace}-{name}.kubeconfig"
        self._identities[path] = identity
        return self.control_plane.kubeconfig(path, identity, context_namespace or self.namespace)

    def kubeconfig_for_user(self, user: str, groups: Iterable[str] = (), path: Path | None = None) -> Path:
        """A kubeconfig acting as ``user`` in ``groups`` (a client certificate from the cluster's CA)."""
        identity = self.control_plane.certificate_identity(user, groups)
        path = path or self.root / "identities" / f"{user.replace(':', '_')}.kubeconfig"
        self._identities[path] = identity
        return self.control_plane.kubeconfig(path, identity, self.namespace)

    def api_as(self, kubeconfig: Path) -> Api:
        """An :class:`~.rest.Api` acting as the identity of ``kubeconfig`` (one of this test's,
        made by the two methods above); close it when done."""
        return Api(self._identities[kubeconfig])

    # -- reading and changing the cluster as a test -------------------------------------------

    def objects(self, kind: Kind, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``kind`` in the test's namespace (or ``namespace``; cluster-wide kinds: all)."""
        return self.admin.list(kind, namespace or self.namespace if kind.namespaced else None)

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.admin.get(kind, name, namespace or self.namespace if kind.namespaced else None)

    def pods(self) -> list[dict[str, Any]]:
        return self.objects(PODS)

    def secrets(self) -> list[dict[str, Any]]:
        return self.objects(SECRETS)

    def events(self, pod: str) -> list[dict[str, Any]]:
        """The events about pod ``pod``, oldest first (as ``kubectl describe`` lists them)."""
        events = self.admin.list(EVENTS, self.namespace, field_selector=f"involvedObject.name={pod}")
        return sorted(events, key=event_time)

    def created_pods(self) -> list[dict[str, Any]]:
        """Every pod created in the test's namespace since the test began, the deleted ones too,
        oldest first, as created."""
        return copy.deepcopy(self.node.created)

    def add(self, kind: Kind, raw: dict[str, Any]) -> dict[str, Any]:
        """Create an object as the administrator (in the test's namespace unless it names one)."""
        raw = copy.deepcopy(raw)
        if kind.namespaced:
            raw.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        raw.setdefault("apiVersion", kind.api_version)
        raw.setdefault("kind", kind.kind)
        return self.admin.create(kind, raw)

    def remove(self, kind: Kind, namespace: str | None, name: str) -> None:
        """Delete an object as the administrator (a pod: gracefully, as ``kubectl delete``)."""
        self.admin.delete(kind, name, namespace if kind.namespaced else None)

    def patch(
        self, kind: Kind, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        return self.admin.patch(kind, name, body, namespace or self.namespace if kind.namespaced else None)

    def pod_log(self, name: str, tail: int | None = None) -> str:
        """A pod's log through the API server (which fetches it from the node's kubelet)."""
        params = {"tailLines": tail} if tail is not None else {}
        return self.admin.text(PODS.path(self.namespace, name, "log"), **params)

    @property
    def violations(self) -> list[str]:
        return list(self.node.violations)

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        return self.node.call(make, timeout)

    async def acall(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        return await self.node.acall(make, timeout)
