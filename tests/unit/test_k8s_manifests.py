"""The Kubernetes backend's pure layer: pod requests by mode and preset, manifests, render-pod.

Golden values are written out by hand from the SPEC §2 table and the middlewares' documentation
(HAMi ``nvidia.com/gpumem`` in MiB, Aliyun ``aliyun.com/gpu-mem`` in GiB, KAI's ``gpu-memory``
annotation in MiB, Volcano ``volcano.sh/vgpu-memory`` in MiB); none is computed by the code under
test. Every manifest is checked against the official schema of Kubernetes 1.30 and 1.37.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError

from jupyter_gpushare.cli import main
from jupyter_gpushare.config import GPUShare, load_settings
from jupyter_gpushare.errors import InvalidRequestError, ModeUnavailableError
from jupyter_gpushare.k8s.build import DEFAULT_ARGV, cluster_facts, kernel_pod
from jupyter_gpushare.k8s.manifests import (
    CONNECTION_FILE,
    HOLDER_ANNOTATION,
    KERNEL_PORTS,
    MOUNT_PATH,
    RUNTIME_PATH,
    TOKEN_FILE,
    kernel_ports,
    label_value,
    make_secret,
    overlay,
    pod_name,
    secret_name,
    selector,
    server_label,
)
from jupyter_gpushare.k8s.presets import DEVICE_PLUGIN_PRESETS, PresetError, resolve_preset
from jupyter_gpushare.k8s.requests import ClusterFacts, PodRequest, pod_request
from jupyter_gpushare.kernelspec import install_kernelspecs
from jupyter_gpushare.sizes import ACCEPTED_FORMS, GiB, parse_size
from jupyter_gpushare.slice_request import make_slice_request

KERNEL_ID = "6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90"
SERVER_ID = "alice@jupyter-alice"
OWNER = "alice"
MIG_PROFILES = ("3g.40gb", "1g.10gb", "7g.80gb", "2g.20gb")  # unordered on purpose
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
MODES = ("exclusive", "timeslice", "mps", "vgpu", "mig")

# Label syntax (k8s.io/apimachinery validation): values <= 63 characters, alphanumeric at both ends;
# keys an optional DNS-subdomain prefix and a name of the same form as values.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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


# ---- the mode x preset table ---------------------------------------------------------------


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


def test_the_golden_table_covers_every_mode_and_preset() -> None:
    assert set(GOLDEN) == set(itertools.product(DEVICE_PLUGIN_PRESETS, MODES))  # DRA: test_k8s_claims.py


@pytest.mark.parametrize(("preset", "mode"), sorted(GOLDEN))
def test_pod_resources_annotations_and_scheduler_by_mode_and_preset(preset: str, mode: str) -> None:
    limits, annotations, scheduler = GOLDEN[preset, mode]
    pod = build(settings(resource_preset=preset), mode=mode, cores=golden_cores(preset, mode))
    assert container(pod)["resources"] == {"limits": limits}
    assert pod["metadata"]["annotations"] == {
        **annotations,
        "jupyter-gpushare.io/server-id": SERVER_ID,
        "jupyter-gpushare.io/size": "whole" if mode == "exclusive" else "6G",
    }
    assert pod["spec"].get("schedulerName") == scheduler
    validate(pod)


@pytest.mark.parametrize("preset", sorted(DEVICE_PLUGIN_PRESETS))
def test_soft_caps_and_slice_variables_by_mode(preset: str) -> None:
    """Pods get the caps no layer below enforces: framework limits everywhere a size is known,
    MPS's pinned limit and thread share in mps mode, nothing of a slice for a whole card."""
    exclusive = env_of(build(settings(resource_preset=preset), mode="exclusive"))
    assert "JUPYTER_GPUSHARE_MEMORY_BYTES" not in exclusive
    assert "CUPY_GPU_MEMORY_LIMIT" not in exclusive
    assert exclusive["JUPYTER_GPUSHARE_MODE"] == "exclusive"

    timeslice = env_of(build(settings(resource_preset=preset), mode="timeslice"))
    assert timeslice["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(6 * GiB) == "6442450944"
    assert timeslice["CUPY_GPU_MEMORY_LIMIT"] == "6442450944"
    assert timeslice["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert timeslice["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in timeslice  # the cards' size is unknown

    mps = env_of(build(settings(resource_preset=preset), mode="mps", cores=30))
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

    mig = env_of(build(settings(resource_preset=preset), mode="mig"))
    assert mig["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(10 * GiB)  # the 1g.10gb instance


def test_the_mps_and_timeslice_caps_know_the_fraction_when_the_cards_size_is_known() -> None:
    env = env_of(build(mode="timeslice", memory="20G", gpu_memory=80 * GiB))
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500"


def test_a_whole_card_in_a_sharing_mode_asks_for_the_whole_card() -> None:
    for mode in ("timeslice", "mps", "vgpu"):
        pod = build(settings(resource_preset="hami"), mode=mode, memory="whole")
        assert container(pod)["resources"] == {"limits": {"nvidia.com/gpu": "1"}}, mode
        assert "schedulerName" not in pod["spec"]


def test_hami_gpu_type_and_kai_queue() -> None:
    hami = build(settings(resource_preset="hami", gpu_type="A100"), mode="vgpu")
    assert hami["metadata"]["annotations"]["nvidia.com/use-gputype"] == "A100"
    kai = build(settings(resource_preset="kai", kai_queue="research"), mode="vgpu")
    assert kai["metadata"]["labels"]["kai.scheduler/queue"] == "research"
    assert kai["metadata"]["annotations"]["gpu-memory"] == "6144"
    # Presets without a gpu-type annotation ignore the setting rather than invent one.
    volcano = build(settings(resource_preset="volcano", gpu_type="A100"), mode="vgpu")
    assert "nvidia.com/use-gputype" not in volcano["metadata"]["annotations"]


def test_the_scheduler_name_setting_overrides_the_presets() -> None:
    pod = build(settings(resource_preset="hami", scheduler_name="my-scheduler"), mode="vgpu")
    assert pod["spec"]["schedulerName"] == "my-scheduler"
    pod = build(settings(scheduler_name="my-scheduler"), mode="exclusive")
    assert pod["spec"]["schedulerName"] == "my-scheduler"


# ---- MIG -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "profile"),
    [
        ("512M", "1g.10gb"),
        ("6G", "1g.10gb"),
        ("10G", "1g.10gb"),  # exactly the instance
        ("10.5G", "2g.20gb"),
        ("20G", "2g.20gb"),
        ("21G", "3g.40gb"),
        ("40G", "3g.40gb"),
        ("41G", "7g.80gb"),
        ("80G", "7g.80gb"),
    ],
)
def test_mig_picks_the_smallest_advertised_profile_that_fits(memory: str, profile: str) -> None:
    pod = build(mode="mig", memory=memory)
    assert container(pod)["resources"] == {"limits": {f"nvidia.com/mig-{profile}": "1"}}


def test_mig_prefers_less_compute_among_profiles_of_equal_memory_and_ignores_other_names() -> None:
    facts = ClusterFacts(resolve_preset("nvidia"), mig_profiles=("2g.10gb", "1g.10gb+me", "1g.10gb"))
    request = pod_request("mig", parse_size("8G"), None, facts)
    assert request.resources == {"nvidia.com/mig-1g.10gb": "1"}
    assert request.memory == 10 * GiB


def test_mig_profiles_come_from_the_settings_when_the_nodes_are_not_known() -> None:
    gpushare = settings(mig_profiles=["1g.5gb", "2g.10gb"])
    _, resources = kernel_pod(
        gpushare,
        kernel_id=KERNEL_ID,
        server_id=SERVER_ID,
        owner=OWNER,
        request=request_for("mig", "6G"),
        cluster=cluster_facts(gpushare),
    )
    assert resources.resources == {"nvidia.com/mig-2g.10gb": "1"}
    # What the nodes advertise wins over the setting.
    assert cluster_facts(gpushare, ["3g.20gb"]).mig_profiles == ("3g.20gb",)


def test_mig_errors_say_what_is_missing() -> None:
    no_profiles = ClusterFacts(resolve_preset("nvidia"))
    with pytest.raises(ModeUnavailableError, match=r"no node advertises nvidia\.com/mig-\* resources"):
        pod_request("mig", parse_size("6G"), None, no_profiles)
    facts = ClusterFacts(resolve_preset("nvidia"), mig_profiles=MIG_PROFILES)
    with pytest.raises(
        InvalidRequestError,
        match=r"81G is larger than any MIG profile the cluster offers "
        r"\(3g\.40gb, 1g\.10gb, 7g\.80gb, 2g\.20gb\)",
    ):
        pod_request("mig", parse_size("81G"), None, facts)
    with pytest.raises(InvalidRequestError, match="'whole' is not a MIG size; use mode 'exclusive'"):
        pod_request("mig", parse_size("whole"), None, facts)


# ---- resource name overrides and percentages ----------------------------------------------


def test_resource_names_rename_the_time_sliced_and_mps_replicas() -> None:
    renamed = settings(
        resource_names={"timeslice_gpu": "nvidia.com/gpu.shared", "mps_gpu": "nvidia.com/gpu.mps"}
    )
    assert container(build(renamed, mode="timeslice"))["resources"] == {
        "limits": {"nvidia.com/gpu.shared": "1"}
    }
    assert container(build(renamed, mode="mps"))["resources"] == {"limits": {"nvidia.com/gpu.mps": "1"}}
    # A whole card is still the device plugin's whole-card resource.
    assert container(build(renamed, mode="exclusive"))["resources"] == {"limits": {"nvidia.com/gpu": "1"}}


def test_resource_names_rename_the_vgpu_resources_and_mig_prefix() -> None:
    renamed = settings(
        resource_preset="hami",
        resource_names={"vgpu_memory": "example.com/vmem", "vgpu_cores": "example.com/vcores"},
    )
    assert container(build(renamed, mode="vgpu", cores=50))["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "example.com/vmem": "6144", "example.com/vcores": "50"}
    }
    prefixed = settings(resource_names={"mig_prefix": "example.com/mig-"})
    assert container(build(prefixed, mode="mig"))["resources"] == {"limits": {"example.com/mig-1g.10gb": "1"}}


def test_unknown_presets_and_resource_name_fields_are_refused_with_the_choices() -> None:
    with pytest.raises(
        PresetError, match="unknown resource preset 'gke'; choose one of: nvidia, hami, volcano"
    ):
        resolve_preset("gke")
    with pytest.raises(
        PresetError, match=r"unknown resource name field\(s\) timeslice; known: .*timeslice_gpu"
    ):
        resolve_preset("nvidia", {"timeslice": "nvidia.com/gpu.shared"})


def test_hami_takes_a_share_of_the_card_as_gpumem_percentage() -> None:
    pod = build(settings(resource_preset="hami"), mode="vgpu", memory="25%")
    assert container(pod)["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}
    }
    assert "JUPYTER_GPUSHARE_MEMORY_BYTES" not in env_of(pod)  # unknown until scheduled
    # A fractional percentage rounds down: never more than asked.
    pod = build(settings(resource_preset="hami"), mode="vgpu", memory="12.5%")
    assert container(pod)["resources"]["limits"]["nvidia.com/gpumem-percentage"] == "12"


@pytest.mark.parametrize(
    ("preset", "mode", "limits"),
    [
        ("nvidia", "timeslice", {"nvidia.com/gpu": "1"}),
        ("volcano", "vgpu", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4096"}),
        ("aliyun", "vgpu", {"aliyun.com/gpu-mem": "4"}),
        ("nvidia", "mig", {"nvidia.com/mig-1g.10gb": "1"}),
    ],
)
def test_other_presets_resolve_a_share_against_the_cards_memory(
    preset: str, mode: str, limits: dict[str, str]
) -> None:
    pod = build(settings(resource_preset=preset), mode=mode, memory="25%", gpu_memory=16 * GiB)
    assert container(pod)["resources"] == {"limits": limits}
    if mode != "mig":
        assert env_of(pod)["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(4 * GiB)


@pytest.mark.parametrize(
    ("preset", "mode"), [("nvidia", "timeslice"), ("volcano", "vgpu"), ("aliyun", "vgpu")]
)
def test_a_share_without_the_cards_memory_is_refused_with_the_fix(preset: str, mode: str) -> None:
    with pytest.raises(
        InvalidRequestError, match=r"a share such as 25% needs the cards' memory: .*nvidia\.com/gpu\.memory"
    ):
        build(settings(resource_preset=preset), mode=mode, memory="25%")


def test_aliyun_rounds_up_to_whole_gib() -> None:
    assert container(build(settings(resource_preset="aliyun"), memory="6.5G"))["resources"] == {
        "limits": {"aliyun.com/gpu-mem": "7"}
    }
    assert container(build(settings(resource_preset="aliyun"), memory="512M"))["resources"] == {
        "limits": {"aliyun.com/gpu-mem": "1"}
    }


@pytest.mark.parametrize("preset", sorted(NO_CORES))
def test_presets_without_a_core_limit_refuse_cores_clearly(preset: str) -> None:
    with pytest.raises(ModeUnavailableError, match=f"resource preset '{preset}' cannot limit GPU cores"):
        build(settings(resource_preset=preset), mode="vgpu", cores=30)


def test_a_preset_with_no_way_to_ask_for_memory_is_refused() -> None:
    facts = ClusterFacts(resolve_preset("kai", {"vgpu_memory_annotation": None}))
    with pytest.raises(ModeUnavailableError, match="resource preset 'kai' has no way to ask for GPU memory"):
        pod_request("vgpu", parse_size("6G"), None, facts)


# ---- one golden pod, field by field ------------------------------------------------------------


def test_the_golden_hami_vgpu_pod() -> None:
    gpushare = settings(
        resource_preset="hami", kernel_image="registry.example.com/kernel:1.2", namespace="notebooks"
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
            "CUPY_GPU_MEMORY_LIMIT": "6442450944",
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
                        {"name": "CUPY_GPU_MEMORY_LIMIT", "value": "6442450944"},
                        {"name": "JUPYTER_GPUSHARE_DEFAULT_MEMORY", "value": "4G"},
                        {"name": "JUPYTER_GPUSHARE_DEFAULT_MODE", "value": "timeslice"},
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


# ---- every manifest validates ------------------------------------------------------------------

TEMPLATES: list[dict[str, Any]] = [
    {},
    {"spec": {"priorityClassName": "notebooks", "securityContext": {"runAsUser": 1000, "fsGroup": 100}}},
    {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"example.com/cost-center": "42"}},
        "spec": {
            "containers": [
                {
                    "name": "kernel",
                    "env": [{"name": "HF_HOME", "value": "/home/jovyan/.cache"}],
                    "volumeMounts": [{"name": "home", "mountPath": "/home/jovyan"}],
                    "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
                },
                {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "infinity"]},
            ],
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "home-alice"}}],
            "imagePullSecrets": [{"name": "registry"}],
        },
    },
]


@pytest.mark.parametrize(("preset", "mode"), sorted(GOLDEN))
@pytest.mark.parametrize("template", range(len(TEMPLATES)))
def test_every_pod_validates_against_the_kubernetes_schema(preset: str, mode: str, template: int) -> None:
    gpushare = settings(
        resource_preset=preset,
        pod_template=TEMPLATES[template],
        node_selector={"nvidia.com/gpu.present": "true", "kubernetes.io/arch": "amd64"},
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "dedicated",
                "operator": "Equal",
                "value": "gpu",
                "effect": "NoExecute",
                "tolerationSeconds": 60,
            },
        ],
        service_account="kernels",
        gpu_type="A100",
        kai_queue="research",
    )
    pod = build(gpushare, mode=mode, cores=golden_cores(preset, mode))
    validate(pod)  # Secrets do not depend on the preset: see the golden Secret
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "kubernetes.io/arch": "amd64"}
    assert pod["spec"]["tolerations"][0] == {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert pod["spec"]["serviceAccountName"] == "kernels"


def test_a_template_adds_volumes_env_and_containers_without_losing_ours() -> None:
    pod = build(settings(pod_template=TEMPLATES[2]), mode="vgpu")
    spec = pod["spec"]
    assert [volume["name"] for volume in spec["volumes"]] == ["connection", "runtime", "home"]
    assert [c["name"] for c in spec["containers"]] == ["kernel", "sidecar"]
    kernel = container(pod)
    assert [mount["mountPath"] for mount in kernel["volumeMounts"]] == [
        MOUNT_PATH,
        RUNTIME_PATH,
        "/home/jovyan",
    ]
    env = env_of(pod)
    assert env["HF_HOME"] == "/home/jovyan/.cache"
    assert env["JUPYTER_GPUSHARE_TOKEN_FILE"] == f"{MOUNT_PATH}/{TOKEN_FILE}"
    # The template's memory limit joins the GPU limits, its requests are added.
    assert kernel["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "memory": "8Gi"},
        "requests": {"cpu": "500m", "memory": "2Gi"},
    }
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "jupyter-gpushare-kernel"


def test_a_template_replaces_a_variable_of_ours_by_name_and_the_init_image() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "connection", "image": "busybox:1.36"}],
            "containers": [
                {"name": "kernel", "env": [{"name": "JUPYTER_GPUSHARE_SAMPLE_INTERVAL", "value": "5"}]}
            ],
        }
    }
    pod = build(settings(pod_template=template))
    assert env_of(pod)["JUPYTER_GPUSHARE_SAMPLE_INTERVAL"] == "5"
    assert len(container(pod)["env"]) == len(build()["spec"]["containers"][0]["env"])
    assert pod["spec"]["initContainers"][0]["image"] == "busybox:1.36"
    assert pod["spec"]["initContainers"][0]["command"][0] == "cp"
    validate(pod)


def test_overlay_never_mutates_its_inputs() -> None:
    base = build(mode="vgpu")
    for template in [
        *TEMPLATES,
        {"spec": {"tolerations": [{"operator": "Exists"}]}, "metadata": {"name": "x"}},
    ]:
        base_before, template_before = copy.deepcopy(base), copy.deepcopy(template)
        merged = overlay(base, template)
        assert base == base_before
        assert template == template_before
        # Nor does the result share a mutable part with either input.
        merged["spec"]["containers"][0]["env"].append({"name": "X", "value": "1"})
        merged["metadata"]["labels"]["y"] = "2"
        for volume in merged["spec"]["volumes"]:
            volume["changed"] = True
        assert base == base_before
        assert template == template_before


def test_overlay_replaces_lists_without_a_merge_key_and_scalars() -> None:
    merged = overlay(
        {"spec": {"tolerations": [{"key": "a"}], "restartPolicy": "Never", "containers": [{"name": "k"}]}},
        {"spec": {"tolerations": [{"key": "b"}], "restartPolicy": "OnFailure"}},
    )
    assert merged == {
        "spec": {"tolerations": [{"key": "b"}], "restartPolicy": "OnFailure", "containers": [{"name": "k"}]}
    }


def test_the_pod_settings_reach_the_pod() -> None:
    pod = build(settings(kernel_image="img:2", service_account="sa"), mode="timeslice", namespace="ns1")
    assert container(pod)["image"] == "img:2"
    assert pod["spec"]["initContainers"][0]["image"] == "img:2"
    assert pod["metadata"]["namespace"] == "ns1"
    assert pod["spec"]["serviceAccountName"] == "sa"
    custom = build(argv=["/opt/conda/bin/python", "-m", "ipykernel", "-f", "{connection_file}"])
    assert container(custom)["command"] == [
        "/opt/conda/bin/python", "-m", "ipykernel", "-f", f"{RUNTIME_PATH}/{CONNECTION_FILE}",
        "--ext=jupyter_gpushare.kernel",
    ]  # fmt: skip
    other = build(argv=["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"])
    assert container(other)["command"][-1] == f"{RUNTIME_PATH}/{CONNECTION_FILE}"  # no ipykernel extension


# ---- names and labels ------------------------------------------------------------------------

ODD_OWNERS = ["alice", "alice@example.com", "Ünïcødé Üser", "x" * 100, "-weird-", "a.b_c-d", ""]
ODD_KERNEL_IDS = [KERNEL_ID, "Kernel_ID.With.Dots", "k" * 100, "UPPER-case-0123"]


def assert_valid_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        assert len(name) <= 63 and LABEL_VALUE.match(name) and name, key
        assert not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN.match(prefix)), key
        assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)


@pytest.mark.parametrize(("owner", "kernel_id"), list(itertools.product(ODD_OWNERS, ODD_KERNEL_IDS)))
def test_labels_and_names_are_valid_for_any_owner_and_kernel_id(owner: str, kernel_id: str) -> None:
    gpushare = settings(resource_preset="kai", kai_queue="research")
    pod, _ = kernel_pod(
        gpushare,
        kernel_id=kernel_id,
        server_id=f"{owner}@host-{owner}",
        owner=owner,
        request=request_for("vgpu"),
        cluster=cluster_facts(gpushare),
    )
    assert_valid_labels(pod["metadata"]["labels"])
    assert len(pod["metadata"]["name"]) <= 63 and DNS_LABEL.match(pod["metadata"]["name"])
    name = secret_name(kernel_id)
    assert len(name) <= 63 and DNS_LABEL.match(name)
    assert name == pod["spec"]["volumes"][0]["secret"]["secretName"]
    validate(pod)
    validate(make_secret(kernel_id, "s", owner, "default", {}, "t"))


def test_label_values_stay_readable_and_distinct() -> None:
    assert label_value("alice") == "alice"
    assert label_value("alice@example.com").startswith("alice-example.com-")
    assert label_value("alice@example.com") != label_value("alice#example.com")
    assert len(label_value("x" * 100)) <= 63
    assert label_value("x" * 100) != label_value("x" * 99)


def test_the_server_selector_matches_the_labels() -> None:
    labels = build()["metadata"]["labels"]
    for requirement in selector(SERVER_ID).split(","):
        key, value = requirement.split("=")
        assert labels[key] == value
    assert server_label(SERVER_ID) != server_label("bob@jupyter-bob")
    assert pod_name(KERNEL_ID) != pod_name("another")


# ---- jupyter gpushare render-pod -------------------------------------------------------------


def rendered(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["render-pod", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ")
    return dict(yaml.safe_load(out))


def expected_render(
    memory: str, mode: str, cores: int | None = None, argv: Any = DEFAULT_ARGV
) -> dict[str, Any]:
    gpushare = load_settings()
    owner = gpushare.effective_owner()
    pod, _ = kernel_pod(
        gpushare,
        kernel_id="00000000-0000-4000-8000-000000000000",
        server_id=f"{owner}@render-pod",
        owner=owner,
        request=make_slice_request(memory, mode, cores, gpushare.default_memory, gpushare.default_mode),
        cluster=cluster_facts(gpushare),
        argv=argv,
    )
    return pod


def test_render_pod_prints_exactly_what_kernel_pod_builds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "hami")
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
    pod = rendered(capsys, "--memory", "6G", "--mode", "vgpu", "--cores", "30")
    assert pod == expected_render("6G", "vgpu", 30)
    assert container(pod)["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "nvidia.com/gpucores": "30"}
    }
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    validate(pod)


def test_render_pod_follows_the_server_config_and_the_preset_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import os
    from pathlib import Path

    config = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {"GPUShare": {"namespace": "notebooks", "pod_template": {"spec": {"priorityClassName": "nb"}}}}
        )
    )
    pod = rendered(capsys, "--memory", "6G", "--mode", "vgpu", "--preset", "aliyun")
    assert container(pod)["resources"] == {"limits": {"aliyun.com/gpu-mem": "6"}}
    assert pod["metadata"]["namespace"] == "notebooks"
    assert pod["spec"]["priorityClassName"] == "nb"
    validate(pod)


def test_render_pod_takes_the_request_and_argv_from_a_kernelspec(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    [(name, _)] = install_kernelspecs(["8G"], "mps", user=True)
    pod = rendered(capsys, "--kernelspec", name)
    assert pod == expected_render("8G", "mps")
    assert env_of(pod)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    # Flags win over the kernelspec.
    assert rendered(capsys, "--kernelspec", name, "--memory", "2G") == expected_render("2G", "mps")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "0G"], ACCEPTED_FORMS),
        (["--memory", "lots"], ACCEPTED_FORMS),
        (["--memory", "4G", "--cores", "500"], "gpu_cores must be from 1 to 100"),
        (["--memory", "25%", "--mode", "timeslice"], "needs the cards' memory"),
        (["--memory", "6G", "--mode", "mig"], "mode 'mig' needs MIG profiles"),
        (["--memory", "6G", "--mode", "vgpu", "--preset", "kai", "--cores", "30"], "cannot limit GPU cores"),
        (["--kernelspec", "no-such-kernel"], "no kernelspec named 'no-such-kernel'"),
    ],
)
def test_render_pod_rejects_bad_input_with_exit_2_and_the_reason(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["render-pod", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("jupyter gpushare: error: ")
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_render_pod_rejects_an_unknown_mode_through_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["render-pod", "--mode", "turbo"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'turbo'" in capsys.readouterr().err


def test_render_pod_reports_a_bad_resource_names_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_NAMES", '{"timeslice": "nvidia.com/gpu.shared"}')
    assert main(["render-pod", "--memory", "4G"]) == 2
    assert "unknown resource name field(s) timeslice" in capsys.readouterr().err


# ---- examples/kubernetes ---------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"

# What the backend calls (jupyter_gpushare/k8s/cluster.py and watch.py), per resource: the Role grants this
# and nothing more.
BACKEND_CALLS = {
    "pods": {"create", "get", "list", "watch", "delete"},
    "pods/log": {"get"},
    "secrets": {"create", "list", "delete"},
    "events": {"list"},
}


def rbac_documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()) if doc]


def test_the_example_rbac_manifests_validate() -> None:
    documents = rbac_documents()
    assert {doc["kind"] for doc in documents} == {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    for document in documents:
        validate(document)


def test_the_example_role_is_least_privilege() -> None:
    documents = rbac_documents()
    [role] = [doc for doc in documents if doc["kind"] == "Role"]
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert granted == BACKEND_CALLS
    [cluster_role] = [doc for doc in documents if doc["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    # Bindings point at the server's ServiceAccount; kernel pods get one with no rights and no token.
    accounts = {
        (doc["metadata"]["namespace"], doc["metadata"]["name"]): doc
        for doc in documents
        if doc["kind"] == "ServiceAccount"
    }
    for binding in (doc for doc in documents if doc["kind"].endswith("Binding")):
        [subject] = binding["subjects"]
        assert (subject["namespace"], subject["name"]) in accounts
    kernel_account = accounts["jupyter-kernels", "jupyter-gpushare-kernel"]
    assert kernel_account["automountServiceAccountToken"] is False
    assert not any(
        subject["name"] == "jupyter-gpushare-kernel"
        for doc in documents
        if doc["kind"].endswith("Binding")
        for subject in doc["subjects"]
    )


def test_the_kernel_image_recipe_installs_what_kernel_pods_need() -> None:
    dockerfile = (EXAMPLES / "kernel-image" / "Dockerfile").read_text()
    assert '"ipykernel>=7.4"' in dockerfile  # reads CurveZMQ keys from the connection file
    assert "jupyter_gpushare-*.whl" in dockerfile  # the kernel side: --ext=jupyter_gpushare.kernel
    assert "zmq.has('curve')" in dockerfile
    assert "command -v cp" in dockerfile  # the init container copies the connection file with cp
    assert "USER 1000" in dockerfile


def test_the_kernelspecs_env_reaches_the_pod_and_ours_wins() -> None:
    pod = build(kernel_env={"OMP_NUM_THREADS": "4", "JUPYTER_GPUSHARE_MODE": "exclusive"})
    env = env_of(pod)
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["JUPYTER_GPUSHARE_MODE"] == "vgpu"  # the slice's own variables cannot be overridden
    validate(pod)


def test_each_pod_of_a_kernel_has_ports_of_its_own() -> None:
    assert kernel_ports(0) == KERNEL_PORTS
    assert kernel_ports(1) == {channel: port + 10 for channel, port in KERNEL_PORTS.items()}
    assert max(kernel_ports(999).values()) == 59995 and kernel_ports(1000) == KERNEL_PORTS
    pod = build(ports=kernel_ports(3))
    assert {port["containerPort"] for port in container(pod)["ports"]} == set(kernel_ports(3).values())
    validate(pod)
