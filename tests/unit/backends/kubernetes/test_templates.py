"""Pod templates, overlays and settings: what an administrator adds reaches the pod without
losing ours, and every pod of every preset, mode and template validates against the official
Kubernetes schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    CONNECTION_FILE,
    MOUNT_PATH,
    RUNTIME_PATH,
    TOKEN_FILE,
    overlay,
)
from tests.support.k8s_pods import (
    GOLDEN,
    build,
    container,
    env_of,
    golden_cores,
    settings,
    validate,
)

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


def test_the_kernelspecs_env_reaches_the_pod_and_ours_wins() -> None:
    pod = build(kernel_env={"OMP_NUM_THREADS": "4", "JUPYTER_GPUSHARE_MODE": "exclusive"})
    env = env_of(pod)
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["JUPYTER_GPUSHARE_MODE"] == "vgpu"  # the slice's own variables cannot be overridden
    validate(pod)
