"""Kernel pod and Secret manifests as plain dicts. Pure: no client, no cluster, no mutation.

One pod per kernel (``restartPolicy: Never``), labelled with the kernel id and the owning
server. The connection file — with the HMAC key and, when encryption is on, the CurveZMQ keys —
and the kernel's own-slice token travel in a Secret mounted read-only, never in args or env.

Secret volumes are read-only, and ipykernel rewrites its connection file at start whenever it
carries CurveZMQ keys (it compares its key bytes with the file's strings), so an init container
copies the file into a memory-backed ``emptyDir`` the kernel may write; the token stays on the
Secret mount.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.pods.requests import PodRequest

APP_LABEL = "app.kubernetes.io/name"
APP = "jupyter-gpushare-kernel"
KERNEL_ID_LABEL = "jupyter-gpushare.io/kernel-id"
SERVER_LABEL = "jupyter-gpushare.io/server"
OWNER_LABEL = "jupyter-gpushare.io/owner"
SERVER_ANNOTATION = "jupyter-gpushare.io/server-id"
MOUNT_PATH = "/etc/jupyter-gpushare"  # the Secret, read-only
RUNTIME_PATH = "/run/jupyter-gpushare"  # an emptyDir (memory) holding the kernel's connection file
KERNEL_FS_GROUP = 100  # the kernel image's group ("users"): it may read the mounted Secret
SIZE_ANNOTATION = "jupyter-gpushare.io/size"  # the slice size as asked ("6G", "25%", "whole")
HOLDER_ANNOTATION = "jupyter-gpushare.io/holder"  # host/pid/start of the process that made the object
CONNECTION_FILE = "connection.json"
TOKEN_FILE = "token"
KERNEL_PORTS = {
    "shell": 50001,
    "iopub": 50002,
    "stdin": 50003,
    "control": 50004,
    "hb": 50005,
}

CLAIM_REQUEST = "gpu"  # the pod's name for its ResourceClaim, and the claim's one request (DRA)
PORT_BLOCKS = 1000  # ports 50001-50005 for a kernel's first pod, 50011-50015 for its next… to 59995


def kernel_ports(generation: int = 0) -> dict[str, int]:
    """The ports of a kernel's ``generation``-th pod (0: its first).

    A restarted kernel comes back in a new pod with a new IP, and jupyter_server renews a
    reconnecting browser's channels only when the kernel's ports change — with the same ports it
    would keep talking to the old pod's address. So each pod of one kernel has ports of its own.
    """
    offset = 10 * (generation % PORT_BLOCKS)
    return {channel: port + offset for channel, port in KERNEL_PORTS.items()}


_NOT_LABEL_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """A valid label value (<= 63 characters, alphanumeric at both ends) that stays readable."""
    cleaned = _NOT_LABEL_CHARACTERS.sub("-", text).strip("-_.")
    if len(cleaned) > 63 or cleaned != text:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        cleaned = f"{cleaned[:52].strip('-_.')}-{digest}" if cleaned else digest
    return cleaned


def server_label(server_id: str) -> str:
    """The label that marks a server's pods; stable for one server process."""
    return "server-" + hashlib.sha256(server_id.encode()).hexdigest()[:16]


def pod_name(kernel_id: str) -> str:
    return f"gpushare-kernel-{_dns_safe(kernel_id)}"[:63].rstrip("-")


def secret_name(kernel_id: str) -> str:
    return f"gpushare-kernel-{_dns_safe(kernel_id)}"[:56].rstrip("-") + "-conn"


def claim_name(kernel_id: str, generation: int = 0) -> str:
    """The ResourceClaim of a kernel's ``generation``-th pod (DRA presets). Each pod has a claim
    of its own name, so a restart never waits for the previous claim to go."""
    return f"{pod_name(kernel_id)}-gpu-{generation}"


def _dns_safe(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def selector(server_id: str) -> str:
    """Label selector for every pod and Secret of one server."""
    return f"{APP_LABEL}={APP},{SERVER_LABEL}={server_label(server_id)}"


@dataclass(frozen=True)
class KernelPodSpec:
    """Everything a kernel pod is made from."""

    kernel_id: str
    server_id: str
    owner: str
    namespace: str
    image: str
    argv: Sequence[str]
    request: PodRequest
    env: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    scheduler_name: str | None = None  # overrides the preset's
    template: Mapping[str, Any] = field(default_factory=dict)  # c.GPUShare.pod_template overlay
    annotations: Mapping[str, str] = field(default_factory=dict)  # extra metadata.annotations
    ports: Mapping[str, int] = field(default_factory=kernel_ports)  # channel -> port
    claim_name: str | None = None  # the pod's ResourceClaim, where the request carries a claim
    labels: Mapping[str, str] = field(default_factory=dict)  # extra metadata.labels (Kueue's queue)


def labels(kernel_id: str, server_id: str, owner: str) -> dict[str, str]:
    return {
        APP_LABEL: APP,
        "app.kubernetes.io/component": "kernel",
        "app.kubernetes.io/managed-by": "jupyter-gpushare",
        KERNEL_ID_LABEL: label_value(kernel_id),
        SERVER_LABEL: server_label(server_id),
        OWNER_LABEL: label_value(owner),
    }


def container_command(argv: Sequence[str]) -> list[str]:
    """The kernelspec's argv with the pod's connection file, and the kernel-side extension."""
    command = [part.replace("{connection_file}", f"{RUNTIME_PATH}/{CONNECTION_FILE}") for part in argv]
    if any("ipykernel" in part for part in command):
        command.append("--ext=jupyter_gpushare.kernel")
    return command


def make_secret(
    kernel_id: str,
    server_id: str,
    owner: str,
    namespace: str,
    connection: Mapping[str, Any],
    token: str,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(kernel_id),
            "namespace": namespace,
            "labels": labels(kernel_id, server_id, owner),
            "annotations": {**(annotations or {}), SERVER_ANNOTATION: server_id},
        },
        "type": "Opaque",
        "stringData": {
            CONNECTION_FILE: json.dumps(dict(connection), sort_keys=True),
            TOKEN_FILE: token,
        },
    }


def make_pod(spec: KernelPodSpec) -> dict[str, Any]:
    request = spec.request
    env = {
        **request.env,
        **spec.env,
        env_names.KERNEL_ID: spec.kernel_id,
        env_names.TOKEN_FILE: f"{MOUNT_PATH}/{TOKEN_FILE}",
        env_names.OWNER: spec.owner,
    }
    if request.memory is not None:
        env[env_names.MEMORY_BYTES] = str(request.memory)
    container: dict[str, Any] = {
        "name": "kernel",
        "image": spec.image,
        "command": container_command(spec.argv),
        "env": [{"name": name, "value": value} for name, value in sorted(env.items())],
        "ports": [
            {"name": name, "containerPort": port, "protocol": "TCP"} for name, port in spec.ports.items()
        ],
        "resources": _resources(request),
        "volumeMounts": [
            {"name": "connection", "mountPath": MOUNT_PATH, "readOnly": True},
            {"name": "runtime", "mountPath": RUNTIME_PATH},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    copy_connection = {
        "name": "connection",
        "image": spec.image,
        "command": ["cp", f"{MOUNT_PATH}/{CONNECTION_FILE}", f"{RUNTIME_PATH}/{CONNECTION_FILE}"],
        "volumeMounts": [
            {"name": "connection", "mountPath": MOUNT_PATH, "readOnly": True},
            {"name": "runtime", "mountPath": RUNTIME_PATH},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "initContainers": [copy_connection],
        "containers": [container],
        "volumes": [
            {
                "name": "connection",
                "secret": {"secretName": secret_name(spec.kernel_id), "defaultMode": 0o400},
            },
            {"name": "runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
        "automountServiceAccountToken": False,
        # The Secret's files are root's, mode 0400; kubelet gives them to this group, readable
        # by it, so the kernel image's user (1000, group 100 in examples/kubernetes/kernel-image)
        # reads its connection file. A pod_template's securityContext overrides it.
        "securityContext": {"fsGroup": KERNEL_FS_GROUP},
    }
    if request.claim is not None:
        # The claim is created with the pod, owned by it (see claims.make_claim); the scheduler
        # waits for it, then allocates it.
        pod_spec["resourceClaims"] = [
            {"name": CLAIM_REQUEST, "resourceClaimName": spec.claim_name or claim_name(spec.kernel_id)}
        ]
    scheduler = spec.scheduler_name or request.scheduler_name
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in spec.tolerations]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.kernel_id),
            "namespace": spec.namespace,
            "labels": {**spec.labels, **labels(spec.kernel_id, spec.server_id, spec.owner), **request.labels},
            "annotations": {**spec.annotations, **request.annotations, SERVER_ANNOTATION: spec.server_id},
        },
        "spec": pod_spec,
    }
    return overlay(pod, spec.template)


def _resources(request: PodRequest) -> dict[str, Any]:
    if request.claim is None:
        return {"limits": dict(request.resources)}
    resources: dict[str, Any] = {"claims": [{"name": CLAIM_REQUEST}]}
    if request.resources:
        resources["limits"] = dict(request.resources)
    return resources


# Lists that merge item by item, matched on a key, as ``kubectl``'s strategic merge patch does;
# any other list in a template replaces ours.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "claims": "name",
}


def overlay(base: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``template`` merged in: dicts merge key by key; the lists of ``MERGE_KEYS``
    (containers, volumes, env…) merge item by item on their key, so a template that adds a
    volume or a variable keeps ours; anything else in the template replaces. Neither input
    changes."""
    merged = copy.deepcopy(dict(base))
    for key, value in template.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            merged[key] = overlay(current, value)
        elif key in MERGE_KEYS and isinstance(current, list) and isinstance(value, list):
            merged[key] = _merge_list(current, value, MERGE_KEYS[key])
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(current: list[Any], additions: list[Any], merge_key: str) -> list[Any]:
    merged = list(current)  # already a deep copy
    positions = {
        item.get(merge_key): index
        for index, item in enumerate(merged)
        if isinstance(item, Mapping) and merge_key in item
    }
    for item in additions:
        index = positions.get(item.get(merge_key)) if isinstance(item, Mapping) else None
        if index is not None and isinstance(item, Mapping):
            merged[index] = overlay(merged[index], item)
        else:
            merged.append(copy.deepcopy(item))
    return merged


def connection_info(
    ports: Mapping[str, int], key: str, kernel_name: str, curve: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The connection file a kernel pod reads: it binds every interface of its pod; with
    ``curve`` (public, secret) its traffic is CurveZMQ-encrypted."""
    info: dict[str, Any] = {
        "transport": "tcp",
        "ip": "0.0.0.0",
        **{f"{channel}_port": port for channel, port in ports.items()},
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": kernel_name,
    }
    if curve is not None:
        info["curve_publickey"], info["curve_secretkey"] = curve
    return info
