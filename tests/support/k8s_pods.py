"""Kubernetes pods as the backend builds them, for the unit tests of its pure layer.

The test modules of pod requests (test_k8s_pod_requests.py), the golden pod and Secret
(test_k8s_golden_pod.py), templates and schema validation (test_k8s_templates.py), names and
labels (test_k8s_names.py), ``render-pod`` (test_k8s_render_pod.py) and the examples
(test_k8s_examples.py) build pods with :func:`build` and check them with :func:`validate`
against the official schema of Kubernetes 1.30 and 1.37.

Golden values are written out by hand from the docs/how-it-works/modes.md table and the middlewares'
documentation (HAMi ``nvidia.com/gpumem`` in MiB, Aliyun ``aliyun.com/gpu-mem`` in GiB, KAI's
``gpu-memory`` annotation in MiB, Volcano ``volcano.sh/vgpu-memory`` in MiB); none is computed by
the code under test.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import ValidationError

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.slice_request import make_slice_request

KERNEL_ID = "6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90"
SERVER_ID = "alice@jupyter-alice"
OWNER = "alice"
MIG_PROFILES = ("3g.40gb", "1g.10gb", "7g.80gb", "2g.20gb")  # unordered on purpose
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
MODES = ("exclusive", "timeslice", "mps", "vgpu", "mig")


def settings(**traits: Any) -> GPUShare:
    return GPUShare(**traits)


def request_for(mode: str, memory: str = "6G", cores: int | None = None) -> Any:
    return make_slice_request(memory, mode, cores, "4G", "timeslice")


def build(
    gpushare: GPUShare | None = None,
    mode: str = "vgpu",
    memory: str = "6G",
    cores: int | None = None,
    gpu_memory: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    gpushare = gpushare or settings()
    pod, _ = kernel_pod(
        gpushare,
        kernel_id=KERNEL_ID,
        server_id=SERVER_ID,
        owner=OWNER,
        request=request_for(mode, memory, cores),
        cluster=cluster_facts(gpushare, MIG_PROFILES, gpu_memory),
        **extra,
    )
    return pod


def container(pod: dict[str, Any], name: str = "kernel") -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(pod)["env"]}


def validate(manifest: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except ValidationError as error:  # the full message quotes the whole schema
            pytest.fail(f"{manifest['kind']} invalid for Kubernetes {version}: {error.message}")


# (preset, mode) -> (container limits, pod annotations, schedulerName) for 6G, cores 30 where
# the mode can limit cores (mps, vgpu) and no cores otherwise.
GOLDEN: dict[tuple[str, str], tuple[dict[str, str], dict[str, str], str | None]] = {
    # The NVIDIA device plugin: whole cards, time-slicing and MPS replicas all use nvidia.com/gpu;
    # its vgpu row speaks HAMi's resource names (HAMi's webhook picks the scheduler).
    ("nvidia", "exclusive"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("nvidia", "timeslice"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("nvidia", "mps"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("nvidia", "vgpu"): (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "nvidia.com/gpucores": "30"},
        {},
        None,
    ),
    ("nvidia", "mig"): ({"nvidia.com/mig-1g.10gb": "1"}, {}, None),
    # HAMi: 6 GiB = 6144 MiB, 30 % of the SMs, and its scheduler.
    ("hami", "exclusive"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("hami", "timeslice"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("hami", "mps"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("hami", "vgpu"): (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "nvidia.com/gpucores": "30"},
        {},
        "hami-scheduler",
    ),
    ("hami", "mig"): ({"nvidia.com/mig-1g.10gb": "1"}, {}, None),
    # Volcano vGPU: its own resource names (MiB) and the volcano scheduler.
    ("volcano", "exclusive"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("volcano", "timeslice"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("volcano", "mps"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("volcano", "vgpu"): (
        {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "6144", "volcano.sh/vgpu-cores": "30"},
        {},
        "volcano",
    ),
    ("volcano", "mig"): ({"nvidia.com/mig-1g.10gb": "1"}, {}, None),
    # KAI: GPU memory as the gpu-memory annotation (MiB), no extended resource; kai-scheduler.
    ("kai", "exclusive"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("kai", "timeslice"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("kai", "mps"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("kai", "vgpu"): ({}, {"gpu-memory": "6144"}, "kai-scheduler"),
    ("kai", "mig"): ({"nvidia.com/mig-1g.10gb": "1"}, {}, None),
    # Aliyun cGPU: GiB, no scheduler of its own.
    ("aliyun", "exclusive"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("aliyun", "timeslice"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("aliyun", "mps"): ({"nvidia.com/gpu": "1"}, {}, None),
    ("aliyun", "vgpu"): ({"aliyun.com/gpu-mem": "6"}, {}, None),
    ("aliyun", "mig"): ({"nvidia.com/mig-1g.10gb": "1"}, {}, None),
}

# Presets that cannot express a compute share: their vgpu rows are built without cores.
NO_CORES = {"kai", "aliyun"}


def golden_cores(preset: str, mode: str) -> int | None:
    return 30 if mode in ("mps", "vgpu") and preset not in NO_CORES else None
