"""One golden pod and its Secret, field by field, and what the pod carries of its kernel: the
connection file and token (never in args or env) and ports of its own."""

from __future__ import annotations

import json

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    CONNECTION_FILE,
    HOLDER_ANNOTATION,
    KERNEL_PORTS,
    MOUNT_PATH,
    RUNTIME_PATH,
    TOKEN_FILE,
    kernel_ports,
    make_secret,
    server_label,
)
from jupyter_gpushare.core.pods.requests import PodRequest
from tests.support.k8s_pods import (
    KERNEL_ID,
    OWNER,
    SERVER_ID,
    build,
    container,
    env_of,
    request_for,
    settings,
    validate,
)


def test_the_golden_hami_vgpu_pod() -> None:
    gpushare = settings(
        backend="kubernetes",
        resource_preset="hami",
        kernel_image="registry.example.com/kernel:1.2",
        namespace="notebooks",
    )
    pod, request = kernel_pod(
        gpushare,
        kernel_id=KERNEL_ID,
        server_id=SERVER_ID,
        owner=OWNER,
        request=request_for("vgpu", "6G", 30),
        cluster=cluster_facts(gpushare),
        annotations={HOLDER_ANNOTATION: "jupyter-alice/7/1700000000.0"},
    )
    assert request == PodRequest(
        resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "nvidia.com/gpucores": "30"},
        scheduler_name="hami-scheduler",
        env={
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "CUPY_GPU_MEMORY_LIMIT": "5637144576",
        },
        memory=6442450944,
    )
    mounts = [
        {"name": "connection", "mountPath": "/etc/jupyter-gpushare", "readOnly": True},
        {"name": "runtime", "mountPath": "/run/jupyter-gpushare"},
    ]
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gpushare-kernel-6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90",
            "namespace": "notebooks",
            "labels": {
                "app.kubernetes.io/name": "jupyter-gpushare-kernel",
                "app.kubernetes.io/component": "kernel",
                "app.kubernetes.io/managed-by": "jupyter-gpushare",
                "jupyter-gpushare.io/kernel-id": KERNEL_ID,
                "jupyter-gpushare.io/server": server_label(SERVER_ID),
                "jupyter-gpushare.io/owner": "alice",
            },
            "annotations": {
                "jupyter-gpushare.io/holder": "jupyter-alice/7/1700000000.0",
                "jupyter-gpushare.io/server-id": SERVER_ID,
                "jupyter-gpushare.io/size": "6G",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "connection",
                    "image": "registry.example.com/kernel:1.2",
                    "command": [
                        "cp",
                        "/etc/jupyter-gpushare/connection.json",
                        "/run/jupyter-gpushare/connection.json",
                    ],
                    "volumeMounts": mounts,
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ],
            "containers": [
                {
                    "name": "kernel",
                    "image": "registry.example.com/kernel:1.2",
                    "command": [
                        "python",
                        "-m",
                        "ipykernel_launcher",
                        "-f",
                        "/run/jupyter-gpushare/connection.json",
                        "--ext=jupyter_gpushare.kernel",
                    ],
                    "env": [
                        {"name": "CUPY_GPU_MEMORY_LIMIT", "value": "5637144576"},
                        {"name": "JUPYTER_GPUSHARE_BACKEND", "value": "kubernetes"},  # its handle
                        {"name": "JUPYTER_GPUSHARE_DEFAULT_MEMORY", "value": "4G"},
                        {"name": "JUPYTER_GPUSHARE_DEFAULT_MODE", "value": "timeslice"},
                        {"name": "JUPYTER_GPUSHARE_IDLE_POD_RESTART", "value": "False"},
                        {"name": "JUPYTER_GPUSHARE_IDLE_RELEASE_AFTER", "value": "0.0"},
                        {"name": "JUPYTER_GPUSHARE_KERNEL_ID", "value": KERNEL_ID},
                        {"name": "JUPYTER_GPUSHARE_MEMORY_BYTES", "value": "6442450944"},
                        {"name": "JUPYTER_GPUSHARE_MODE", "value": "vgpu"},
                        {"name": "JUPYTER_GPUSHARE_OVER_LIMIT_ACTION", "value": "warn"},
                        {"name": "JUPYTER_GPUSHARE_OWNER", "value": "alice"},
                        {"name": "JUPYTER_GPUSHARE_SAMPLE_INTERVAL", "value": "1.0"},
                        {"name": "JUPYTER_GPUSHARE_TOKEN_FILE", "value": "/etc/jupyter-gpushare/token"},
                        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
                        {"name": "XLA_PYTHON_CLIENT_PREALLOCATE", "value": "false"},
                    ],
                    "ports": [
                        {"name": "shell", "containerPort": 50001, "protocol": "TCP"},
                        {"name": "iopub", "containerPort": 50002, "protocol": "TCP"},
                        {"name": "stdin", "containerPort": 50003, "protocol": "TCP"},
                        {"name": "control", "containerPort": 50004, "protocol": "TCP"},
                        {"name": "hb", "containerPort": 50005, "protocol": "TCP"},
                    ],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "6144",
                            "nvidia.com/gpucores": "30",
                        }
                    },
                    "volumeMounts": mounts,
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ],
            "volumes": [
                {
                    "name": "connection",
                    "secret": {
                        "secretName": "gpushare-kernel-6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90-conn",
                        "defaultMode": 0o400,
                    },
                },
                {"name": "runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ],
            "automountServiceAccountToken": False,
            # The kernel image's user (1000, group 100) reads the Secret's 0400 files.
            "securityContext": {"fsGroup": 100},
            "schedulerName": "hami-scheduler",
        },
    }
    validate(pod)


def test_the_golden_secret_holds_the_connection_file_and_token() -> None:
    connection = {"ip": "0.0.0.0", "key": "hmac-key", "transport": "tcp", "shell_port": 50001}
    secret = make_secret(
        KERNEL_ID, SERVER_ID, OWNER, "notebooks", connection, "tok", {HOLDER_ANNOTATION: "h/1/2"}
    )
    assert secret == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "gpushare-kernel-6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90-conn",
            "namespace": "notebooks",
            "labels": {
                "app.kubernetes.io/name": "jupyter-gpushare-kernel",
                "app.kubernetes.io/component": "kernel",
                "app.kubernetes.io/managed-by": "jupyter-gpushare",
                "jupyter-gpushare.io/kernel-id": KERNEL_ID,
                "jupyter-gpushare.io/server": server_label(SERVER_ID),
                "jupyter-gpushare.io/owner": "alice",
            },
            "annotations": {
                "jupyter-gpushare.io/holder": "h/1/2",
                "jupyter-gpushare.io/server-id": SERVER_ID,
            },
        },
        "type": "Opaque",
        "stringData": {
            "connection.json": (
                '{"ip": "0.0.0.0", "key": "hmac-key", "shell_port": 50001, "transport": "tcp"}'
            ),
            "token": "tok",
        },
    }
    validate(secret)


def test_the_connection_file_and_token_never_reach_args_or_env() -> None:
    pod = build(mode="vgpu")
    text = json.dumps(pod)
    assert "hmac-key" not in text and "tok3n" not in text
    kernel = container(pod)
    assert f"{RUNTIME_PATH}/{CONNECTION_FILE}" in kernel["command"]
    assert env_of(pod)["JUPYTER_GPUSHARE_TOKEN_FILE"] == f"{MOUNT_PATH}/{TOKEN_FILE}"
    assert "JUPYTER_GPUSHARE_TOKEN" not in env_of(pod)
    assert {port["containerPort"] for port in kernel["ports"]} == set(KERNEL_PORTS.values())


def test_each_pod_of_a_kernel_has_ports_of_its_own() -> None:
    assert kernel_ports(0) == KERNEL_PORTS
    assert kernel_ports(1) == {channel: port + 10 for channel, port in KERNEL_PORTS.items()}
    assert max(kernel_ports(999).values()) == 59995 and kernel_ports(1000) == KERNEL_PORTS
    pod = build(ports=kernel_ports(3))
    assert {port["containerPort"] for port in container(pod)["ports"]} == set(kernel_ports(3).values())
    validate(pod)
