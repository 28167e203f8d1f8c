"""A ResourceClaim per single-user server, for KubeSpawner profiles under a DRA preset.

KubeSpawner has no ``resourceClaims`` support, so :func:`jupyter_gpushare.hub.gpu_profiles`
sets two of its hooks per GPU choice, as its ``kubespawner_override``:

* ``modify_pod_hook`` — the server's pod refers to a claim named after it
  (``<pod name>-gpu``), and its notebook container lists the claim among its resources, beside
  the CPU and memory KubeSpawner set;
* ``after_pod_created_hook`` — once the pod exists, the claim is created, owned by the pod, so it
  goes with the pod when the server stops (a claim of that name left by an earlier pod is
  replaced). The scheduler waits for it, then allocates it.

Hooks an admin configured on KubeSpawner run first. The hub's service account needs
``create``/``get``/``delete`` on ``resourceclaims`` in the users' namespace
(examples/kubernetes/rbac-dra.yaml). The claim's spec is the same as a kernel pod's
(:mod:`..objects.claims`); a custom size computes it from that spawn's own option.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.claims import make_claim
from jupyter_gpushare.backends.kubernetes.objects.manifests import CLAIM_REQUEST, OWNER_LABEL, label_value

SERVER_APP = "jupyter-gpushare-server"
SIZE_ANNOTATION = "jupyter-gpushare.io/size"

Hook = Callable[[Any, Any], Any]


def server_claim_name(pod_name: str) -> str:
    return f"{pod_name}-gpu"


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _get(obj: Any, *path: str) -> Any:
    """A field of a pod given as a client model or as a dict (the reflector keeps dicts)."""
    for step in path:
        if obj is None:
            return None
        obj = obj.get(step) if isinstance(obj, Mapping) else getattr(obj, _snake(step), None)
    return obj


def _snake(name: str) -> str:
    return "".join(f"_{char.lower()}" if char.isupper() else char for char in name)


@dataclass(frozen=True)
class ServerClaim:
    """The two hooks of one GPU choice: ``spec_of(spawner)`` is the claim's spec for this spawn."""

    spec_of: Callable[[Any], Mapping[str, Any]]
    size_of: Callable[[Any], str]

    @classmethod
    def fixed(cls, spec: Mapping[str, Any], size: str) -> ServerClaim:
        """The claim of a listed size: the same spec for every spawn."""
        return cls(lambda spawner: spec, lambda spawner: size)

    def modify_pod_hook(self, spawner: Any) -> Hook:
        """KubeSpawner override value (it calls callables with the spawner)."""
        configured = configured_hook(spawner, "modify_pod_hook")

        async def attach_claim(spawner: Any, pod: Any) -> Any:
            if configured is not None:
                pod = await _maybe(configured(spawner, pod))
            self.spec_of(spawner)  # a bad custom size fails the spawn before anything is created
            return attach(pod, server_claim_name(spawner.pod_name))

        return attach_claim

    def after_pod_created_hook(self, spawner: Any) -> Hook:
        configured = configured_hook(spawner, "after_pod_created_hook")

        async def create_claim(spawner: Any, pod: Any) -> None:
            await ensure_claim(spawner, pod, self.claim(spawner, pod))
            if configured is not None:
                await _maybe(configured(spawner, pod))

        return create_claim

    def claim(self, spawner: Any, pod: Any) -> dict[str, Any]:
        """The claim of ``spawner``'s server, owned by its ``pod``."""
        owner = str(getattr(getattr(spawner, "user", None), "name", "") or "")
        return make_claim(
            server_claim_name(spawner.pod_name),
            spawner.namespace,
            self.spec_of(spawner),
            labels={
                "app.kubernetes.io/name": SERVER_APP,
                "app.kubernetes.io/managed-by": "jupyter-gpushare",
                OWNER_LABEL: label_value(owner or "unknown"),
            },
            annotations={SIZE_ANNOTATION: self.size_of(spawner)},
            owner={"name": str(_get(pod, "metadata", "name")), "uid": str(_get(pod, "metadata", "uid"))},
        )


def configured_hook(spawner: Any, name: str) -> Hook | None:
    """The hook the admin configured on KubeSpawner (not ours from an earlier spawn)."""
    config = getattr(spawner, "config", None)
    section = config.get("KubeSpawner", {}) if config is not None else {}
    hook = section.get(name) if hasattr(section, "get") else None
    return hook if callable(hook) else None


def attach(pod: Any, claim: str) -> Any:
    """The server pod (a kubernetes_asyncio ``V1Pod``) referring to ``claim``: the pod's
    ``resourceClaims`` entry and the notebook container's ``resources.claims``."""
    from kubernetes_asyncio.client import (  # KubeSpawner's client, present wherever it runs
        CoreV1ResourceClaim,
        V1PodResourceClaim,
        V1ResourceRequirements,
    )

    entries = [entry for entry in pod.spec.resource_claims or [] if entry.name != CLAIM_REQUEST]
    pod.spec.resource_claims = [*entries, V1PodResourceClaim(name=CLAIM_REQUEST, resource_claim_name=claim)]
    container = next((c for c in pod.spec.containers if c.name == "notebook"), pod.spec.containers[0])
    if container.resources is None:
        container.resources = V1ResourceRequirements()
    claims = [item for item in container.resources.claims or [] if item.name != CLAIM_REQUEST]
    container.resources.claims = [*claims, CoreV1ResourceClaim(name=CLAIM_REQUEST)]
    return pod


async def ensure_claim(spawner: Any, pod: Any, body: dict[str, Any]) -> None:
    """Create the server's claim with KubeSpawner's API client; a claim of that name owned by an
    earlier pod (still being collected) is replaced."""
    from kubernetes_asyncio.client import ResourceV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    api = ResourceV1Api(spawner.api.api_client)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        await api.create_namespaced_resource_claim(namespace, body)  # type: ignore[arg-type]
        return
    except ApiException as error:
        if error.status != 409:
            raise
    await api.delete_namespaced_resource_claim(name, namespace)
    await api.create_namespaced_resource_claim(namespace, body)  # type: ignore[arg-type]


__all__ = ["ServerClaim", "attach", "configured_hook", "server_claim_name"]
