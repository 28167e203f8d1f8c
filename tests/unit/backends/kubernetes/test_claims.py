"""The DRA dialect: ResourceClaims by mode and DRA preset, the pod that refers to its claim,
render-pod, and every manifest against the official schemas.

Golden claims are written out by hand from the drivers' documented shapes: NVIDIA's DRA driver
(device classes ``gpu.nvidia.com`` / ``mig.nvidia.com``, ``GpuConfig`` of
``resource.nvidia.com/v1beta1`` with ``sharing.strategy`` TimeSlicing or MPS, ``mpsConfig``'s
``defaultPinnedDeviceMemoryLimit`` and ``defaultActiveThreadPercentage``, the MIG ``profile``
attribute), HAMi's DRA driver (class and driver ``hami-core-gpu.project-hami.io``, consumable
``memory`` and ``cores`` capacity) and Kubernetes' ``resource.k8s.io/v1`` API (``exactly``,
``firstAvailable``, ``capacity.requests``, CEL selectors). None is computed by the code under test.
Every pod and claim is validated, strictly, against Kubernetes 1.34 (where ``resource.k8s.io/v1``
is GA) and the newest version the validator knows.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError, latest_version

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_claim, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.claims import (
    allocated_mode,
    describe_claim,
    make_claim_template,
    pod_claim_reference,
)
from jupyter_gpushare.backends.kubernetes.objects.manifests import HOLDER_ANNOTATION, claim_name, server_label
from jupyter_gpushare.backends.kubernetes.objects.presets import DRA_PRESETS
from jupyter_gpushare.cli import main
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import ConfigurationError, ModeUnavailableError
from jupyter_gpushare.core.sizes import GiB
from jupyter_gpushare.core.slice_request import make_slice_request

KERNEL_ID = "6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90"
SERVER_ID = "alice@jupyter-alice"
MODES = ("exclusive", "timeslice", "mps", "vgpu", "mig")
VERSIONS = ("1.34.0", latest_version())
MIG_PROFILES = ("3g.40gb", "1g.10gb", "7g.80gb")
# The generic preset, named for a made-up driver that offers everything.
GENERIC = {
    "dra_driver": "gpu.example.com",
    "dra_device_class": "gpu.example.com",
    "dra_mig_device_class": "mig.example.com",
    "dra_cores_capacity": "sm-percent",
    "dra_consumable_capacity": True,
}
TRAITS = {"nvidia-dra": {}, "hami-dra": {}, "dra": GENERIC}

NVIDIA_MEMORY = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("6Gi")) >= 0'
HAMI_MEMORY = 'device.capacity["hami-core-gpu.project-hami.io"].memory.compareTo(quantity("6Gi")) >= 0'
GENERIC_MEMORY = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("6Gi")) >= 0'


def one(
    device_class: str, selectors: list[str] | None = None, capacity: dict[str, str] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if selectors:
        body["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    if capacity:
        body["capacity"] = {"requests": capacity}
    return body


def gpu_config(sharing: dict[str, Any], requests: tuple[str, ...] = ("gpu",)) -> dict[str, Any]:
    return {
        "requests": list(requests),
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }


TIME_SLICING = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
MPS_30 = {
    "strategy": "MPS",
    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "6Gi", "defaultActiveThreadPercentage": 30},
}

# (preset, mode) -> the claim's spec.devices for 6G (cores 30 in mps and vgpu), or the refusal.
GOLDEN: dict[tuple[str, str], dict[str, Any] | str] = {
    ("nvidia-dra", "exclusive"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.nvidia.com", [NVIDIA_MEMORY])}]
    },
    ("nvidia-dra", "timeslice"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.nvidia.com", [NVIDIA_MEMORY])}],
        "config": [gpu_config(TIME_SLICING)],
    },
    ("nvidia-dra", "mps"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.nvidia.com", [NVIDIA_MEMORY])}],
        "config": [gpu_config(MPS_30)],
    },
    ("nvidia-dra", "vgpu"): "has no vgpu",
    ("nvidia-dra", "mig"): {
        "requests": [
            {
                "name": "gpu",
                "exactly": one(
                    "mig.nvidia.com", ['device.attributes["gpu.nvidia.com"].profile == "1g.10gb"']
                ),
            }
        ]
    },
    # HAMi-DRA: every claim on a card consumes part of its memory (and cores).
    ("hami-dra", "exclusive"): {
        "requests": [{"name": "gpu", "exactly": one("hami-core-gpu.project-hami.io", [HAMI_MEMORY])}]
    },
    ("hami-dra", "timeslice"): {
        "requests": [
            {"name": "gpu", "exactly": one("hami-core-gpu.project-hami.io", [HAMI_MEMORY], {"memory": "6Gi"})}
        ]
    },
    ("hami-dra", "mps"): {
        "requests": [
            {"name": "gpu", "exactly": one("hami-core-gpu.project-hami.io", [HAMI_MEMORY], {"memory": "6Gi"})}
        ]
    },
    ("hami-dra", "vgpu"): {
        "requests": [
            {
                "name": "gpu",
                "exactly": one(
                    "hami-core-gpu.project-hami.io", [HAMI_MEMORY], {"memory": "6Gi", "cores": "30"}
                ),
            }
        ]
    },
    ("hami-dra", "mig"): "has no MIG device class",
    ("dra", "exclusive"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.example.com", [GENERIC_MEMORY])}]
    },
    ("dra", "timeslice"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.example.com", [GENERIC_MEMORY], {"memory": "6Gi"})}]
    },
    ("dra", "mps"): {
        "requests": [{"name": "gpu", "exactly": one("gpu.example.com", [GENERIC_MEMORY], {"memory": "6Gi"})}]
    },
    ("dra", "vgpu"): {
        "requests": [
            {
                "name": "gpu",
                "exactly": one("gpu.example.com", [GENERIC_MEMORY], {"memory": "6Gi", "sm-percent": "30"}),
            }
        ]
    },
    ("dra", "mig"): {
        "requests": [
            {
                "name": "gpu",
                "exactly": one(
                    "mig.example.com", ['device.attributes["gpu.example.com"].profile == "1g.10gb"']
                ),
            }
        ]
    },
}


def settings(preset: str, **traits: Any) -> GPUShare:
    return GPUShare(resource_preset=preset, **{**TRAITS[preset], **traits})


def build(
    gpushare: GPUShare, mode: str, memory: str = "6G", cores: int | None = None, generation: int = 0
) -> tuple[dict[str, Any], dict[str, Any] | None, Any]:
    request = make_slice_request(memory, mode, cores, "4G", "timeslice")
    pod, pod_request = kernel_pod(
        gpushare,
        kernel_id=KERNEL_ID,
        server_id=SERVER_ID,
        owner="alice",
        request=request,
        cluster=cluster_facts(gpushare, MIG_PROFILES),
        namespace="notebooks",
        generation=generation,
    )
    claim = kernel_claim(
        pod_request,
        kernel_id=KERNEL_ID,
        server_id=SERVER_ID,
        owner="alice",
        namespace="notebooks",
        size=request.size.text,
        generation=generation,
        pod={"name": pod["metadata"]["name"], "uid": "0b5e3a0c-0000-4000-8000-000000000001"},
    )
    return pod, claim, pod_request


def validate(manifest: dict[str, Any]) -> None:
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except ValidationError as error:
            pytest.fail(f"{manifest['kind']} invalid for Kubernetes {version}: {error.message}")


def cores_for(mode: str) -> int | None:
    return 30 if mode in ("mps", "vgpu") else None


def test_the_golden_table_covers_every_mode_and_dra_preset() -> None:
    assert set(DRA_PRESETS) == {"nvidia-dra", "hami-dra", "dra"}
    assert set(GOLDEN) == set(itertools.product(DRA_PRESETS, MODES))


@pytest.mark.parametrize(("preset", "mode"), sorted(GOLDEN))
def test_claims_by_mode_and_dra_preset_validate_with_their_pods(preset: str, mode: str) -> None:
    expected = GOLDEN[preset, mode]
    if isinstance(expected, str):
        with pytest.raises(ModeUnavailableError, match=expected):
            build(settings(preset), mode, cores=cores_for(mode))
        return
    pod, claim, _ = build(settings(preset), mode, cores=cores_for(mode))
    assert claim is not None
    assert claim["spec"] == {"devices": expected}
    # The pod asks for no extended resource: its container refers to the claim, made with it.
    kernel = pod["spec"]["containers"][0]
    assert kernel["resources"] == {"claims": [{"name": "gpu"}]}
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
    assert "schedulerName" not in pod["spec"]
    validate(pod)
    validate(claim)


def test_the_golden_nvidia_mps_claim_field_by_field() -> None:
    _, claim, request = build(settings("nvidia-dra"), "mps", cores=30, generation=2)
    assert claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "gpushare-kernel-6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90-gpu-2",
            "namespace": "notebooks",
            "labels": {
                "app.kubernetes.io/name": "jupyter-gpushare-kernel",
                "app.kubernetes.io/component": "kernel",
                "app.kubernetes.io/managed-by": "jupyter-gpushare",
                "jupyter-gpushare.io/kernel-id": KERNEL_ID,
                "jupyter-gpushare.io/server": server_label(SERVER_ID),
                "jupyter-gpushare.io/owner": "alice",
            },
            "annotations": {"jupyter-gpushare.io/server-id": SERVER_ID, "jupyter-gpushare.io/size": "6G"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "gpushare-kernel-6f1c2a4e-9b7d-4c3e-8a51-0d2f4b6c8e90",
                    "uid": "0b5e3a0c-0000-4000-8000-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"devices": GOLDEN["nvidia-dra", "mps"]},
    }
    # NVIDIA's driver runs MPS and enforces the limit; the kernel gets the framework caps.
    assert request.memory == 6 * GiB
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in request.env
    assert request.env["CUPY_GPU_MEMORY_LIMIT"] == str(6 * GiB - 768 * 2**20)


def test_kernel_variables_follow_the_claim() -> None:
    pod, _, _ = build(settings("hami-dra"), "mps", cores=30)
    env = {item["name"]: item["value"] for item in pod["spec"]["containers"][0]["env"]}
    # A driver without NVIDIA's GpuConfig: MPS's client variables, as device-plugin pods get.
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(6 * GiB)
    assert env["JUPYTER_GPUSHARE_MODE"] == "mps"
    mig, _, _ = build(settings("nvidia-dra"), "mig")
    mig_env = {item["name"]: item["value"] for item in mig["spec"]["containers"][0]["env"]}
    assert mig_env["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(10 * GiB)  # the 1g.10gb device


def test_consumable_capacity_lets_nvidia_claims_share_a_card_by_memory() -> None:
    _, claim, _ = build(settings("nvidia-dra", dra_consumable_capacity=True), "timeslice")
    assert claim is not None
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "6Gi"}}
    validate(claim)
    # Detected from the ResourceSlices when the setting says nothing, and the setting wins.
    detected = cluster_facts(settings("nvidia-dra"), consumable_capacity=True)
    assert detected.preset.dra is not None and detected.preset.dra.consumable_capacity
    refused = cluster_facts(settings("nvidia-dra", dra_consumable_capacity=False), consumable_capacity=True)
    assert refused.preset.dra is not None and not refused.preset.dra.consumable_capacity


def test_exclusive_selects_a_card_with_the_memory_asked_and_the_gpu_type() -> None:
    _, claim, _ = build(settings("nvidia-dra", gpu_type="A100"), "exclusive", memory="40G")
    assert claim is not None
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] == [
        {"cel": {"expression": 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'}},
        {
            "cel": {
                "expression": 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'
            }
        },
    ]
    _, whole, _ = build(settings("nvidia-dra"), "exclusive", memory="whole")
    assert whole is not None and "selectors" not in whole["spec"]["devices"]["requests"][0]["exactly"]


def test_fallbacks_become_first_available_and_the_allocation_says_which() -> None:
    gpushare = settings("nvidia-dra", dra_fallbacks=["mig", "mps", "exclusive"])
    pod, claim, request = build(gpushare, "mig")
    assert claim is not None
    assert claim["spec"]["devices"] == {
        "requests": [
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "mig",
                        **one("mig.nvidia.com", ['device.attributes["gpu.nvidia.com"].profile == "1g.10gb"']),
                    },
                    {"name": "mps", **one("gpu.nvidia.com", [NVIDIA_MEMORY])},
                    {"name": "exclusive", **one("gpu.nvidia.com", [NVIDIA_MEMORY])},
                ],
            }
        ],
        "config": [
            gpu_config(
                {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "6Gi"}}, ("gpu/mps",)
            )
        ],
    }
    validate(claim)
    validate(pod)
    # The kernel's caps hold it to the slice asked, whichever alternative it gets.
    assert request.memory == 6 * GiB and request.env["CUPY_GPU_MEMORY_LIMIT"] == str(6 * GiB - 768 * 2**20)
    # A mode that is not among the fallbacks asks for itself alone.
    _, alone, _ = build(gpushare, "timeslice")
    assert alone is not None and "exactly" in alone["spec"]["devices"]["requests"][0]
    # A whole card: MIG cannot hold it, MPS's whole card is the exclusive one, asked for once.
    _, whole, _ = build(gpushare, "exclusive", memory="whole")
    assert whole is not None
    assert whole["spec"]["devices"]["requests"] == [{"name": "gpu", "exactly": one("gpu.nvidia.com")}]
    assert (
        allocated_mode({"status": {"allocation": {"devices": {"results": [{"request": "gpu/mps"}]}}}})
        == "mps"
    )
    assert allocated_mode({"status": {"allocation": {"devices": {"results": [{"request": "gpu"}]}}}}) is None
    assert allocated_mode({"status": {}}) is None


def test_dra_refusals_say_what_to_set() -> None:
    with pytest.raises(
        ConfigurationError, match=r"set c\.GPUShare\.dra_driver and c\.GPUShare\.dra_device_class"
    ):
        build(GPUShare(resource_preset="dra"), "timeslice")
    with pytest.raises(
        ModeUnavailableError, match="mode 'vgpu' needs a DRA driver whose GPUs take several claims"
    ):
        build(settings("dra", dra_consumable_capacity=False), "vgpu")
    with pytest.raises(
        ModeUnavailableError, match=r"cannot limit GPU cores: set c\.GPUShare\.dra_cores_capacity"
    ):
        build(GPUShare(resource_preset="dra", **{**GENERIC, "dra_cores_capacity": ""}), "vgpu", cores=30)
    with pytest.raises(ModeUnavailableError, match=r"no ResourceSlice of gpu\.nvidia\.com offers one"):
        gpushare = settings("nvidia-dra")
        kernel_pod(
            gpushare,
            kernel_id=KERNEL_ID,
            server_id=SERVER_ID,
            owner="alice",
            request=make_slice_request("6G", "mig", None, "4G", "timeslice"),
            cluster=cluster_facts(gpushare),
        )


def test_device_plugin_presets_make_no_claim() -> None:
    pod, claim, request = build(GPUShare(resource_preset="hami"), "vgpu")
    assert claim is None and request.claim is None
    assert "resourceClaims" not in pod["spec"]


def test_a_template_and_a_pod_reference_for_single_user_servers() -> None:
    _, _, request = build(settings("hami-dra"), "vgpu", cores=30)
    template = make_claim_template(
        "gpushare-vgpu-6g", request.claim, labels={"app": "x"}, namespace="jupyter"
    )
    assert template["spec"] == {"spec": request.claim}
    validate(template)
    assert pod_claim_reference("gpushare-vgpu-6g", template=True) == {
        "name": "gpu",
        "resourceClaimTemplateName": "gpushare-vgpu-6g",
    }
    assert describe_claim(request.claim).startswith(
        "1 hami-core-gpu.project-hami.io device consuming cores=30, memory=6Gi where "
    )


def test_render_pod_prints_the_pod_and_its_claim(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
    assert (
        main(["render-pod", "--preset", "nvidia-dra", "--memory", "6G", "--mode", "mps", "--cores", "30"])
        == 0
    )
    pod, claim = list(yaml.safe_load_all(capsys.readouterr().out))
    assert pod["kind"] == "Pod" and claim["kind"] == "ResourceClaim"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
    assert claim["metadata"]["name"] == claim_name("00000000-0000-4000-8000-000000000000")
    assert claim["spec"] == {"devices": GOLDEN["nvidia-dra", "mps"]}
    assert HOLDER_ANNOTATION not in claim["metadata"]["annotations"]
    validate(pod)
    validate(claim)


def test_render_pod_refuses_a_mode_the_dra_preset_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render-pod", "--preset", "nvidia-dra", "--mode", "vgpu"]) == 2
    assert "has no vgpu" in capsys.readouterr().err


# ---- examples/kubernetes/rbac-dra.yaml --------------------------------------------------------

RBAC_DRA = Path(__file__).resolve().parents[4] / "examples" / "kubernetes" / "rbac-dra.yaml"


def test_the_dra_rbac_example_grants_what_the_dra_calls_need_and_no_more() -> None:
    documents = [doc for doc in yaml.safe_load_all(RBAC_DRA.read_text()) if doc]
    for document in documents:
        validate(document)
    granted: dict[tuple[str, str, str], set[str]] = {}
    for role in (doc for doc in documents if doc["kind"] in ("Role", "ClusterRole")):
        where = role["metadata"].get("namespace", "cluster")
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["resource.k8s.io"]
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            for resource in rule["resources"]:
                granted.setdefault((role["metadata"]["name"], where, resource), set()).update(rule["verbs"])
    assert granted == {
        # k8s/cluster.py: create_claim, read_claim, list_claims (orphans), delete_claim
        ("jupyter-gpushare-claims", "jupyter-kernels", "resourceclaims"): {"create", "get", "list", "delete"},
        # k8s/watch.py (and the listings without a watch): the pool from DRA objects
        ("jupyter-gpushare-dra", "cluster", "resourceslices"): {"list", "watch"},
        ("jupyter-gpushare-dra", "cluster", "resourceclaims"): {"list", "watch"},
        ("jupyter-gpushare-dra", "cluster", "deviceclasses"): {"list", "watch"},
        # k8s/spawner_claims.py: the hub creates a claim per server (replacing a stale one)
        ("jupyter-gpushare-server-claims", "jupyter", "resourceclaims"): {"create", "delete"},
    }


def test_a_kernels_claim_is_put_in_its_pods_kueue_local_queue() -> None:
    """Under ``c.GPUShare.kueue_queue`` the claim carries the pod's queue label, as created from the
    pod (kernel_objects.create_claim reads it off the pod it was made for) and as render-pod shows."""
    from jupyter_gpushare.backends.kubernetes.kernel_objects import ClaimOf, create_claim
    from jupyter_gpushare.backends.kubernetes.objects.kueue import QUEUE_LABEL

    gpushare = GPUShare(resource_preset="nvidia-dra", kueue_queue="team-a")
    pod, claim, pod_request = build(gpushare, "timeslice")
    assert pod["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert claim is not None and QUEUE_LABEL not in claim["metadata"]["labels"]  # no queue asked

    class Created:
        namespace = "notebooks"

        def __init__(self) -> None:
            self.claims: list[dict[str, Any]] = []

        def create_claim(self, body: dict[str, Any]) -> None:
            self.claims.append(body)

    cluster = Created()
    of = ClaimOf(KERNEL_ID, SERVER_ID, "alice", "6G", 0, {})
    create_claim(cluster, pod_request, {**pod, "metadata": {**pod["metadata"], "uid": "u-1"}}, of)  # type: ignore[arg-type]
    [made] = cluster.claims
    assert made["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    others = {name: value for name, value in made["metadata"]["labels"].items() if name != QUEUE_LABEL}
    assert others == claim["metadata"]["labels"]
    validate(made)


def test_render_pod_shows_the_claim_in_the_pods_kueue_local_queue(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_gpushare.backends.kubernetes.objects.kueue import QUEUE_LABEL

    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
    monkeypatch.setenv("JUPYTER_GPUSHARE_KUEUE_QUEUE", "team-a")
    assert main(["render-pod", "--preset", "nvidia-dra", "--memory", "6G", "--mode", "timeslice"]) == 0
    pod, claim = list(yaml.safe_load_all(capsys.readouterr().out))
    assert pod["metadata"]["labels"][QUEUE_LABEL] == claim["metadata"]["labels"][QUEUE_LABEL] == "team-a"
