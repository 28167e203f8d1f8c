"""KubeSpawner profiles under a DRA preset: each single-user server gets a ResourceClaim of its
own, through real KubeSpawner objects (its test mode) and the official schemas.

The claim's creation against an API server is in tests/integration/test_kubernetes_dra.py.
"""

from __future__ import annotations

import inspect
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient
from kubernetes_validate.utils import ValidationError, latest_version
from kubespawner import KubeSpawner
from traitlets.config import Config

from jupyter_gpushare.cli import main
from jupyter_gpushare.hub import claim_templates, gpu_profiles, static_profiles
from tests.unit.test_hub import offline_cluster  # noqa: F401 (an autouse fixture: KubeSpawner's kubeconfig)

VERSIONS = ("1.34.0", latest_version())
# Turns KubeSpawner's models into the JSON the API receives; it needs no connection (and a
# constructed client would open an HTTP session nobody closes).
SERIALIZER = ApiClient.__new__(ApiClient)


def validate(manifest: dict[str, Any]) -> None:
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except ValidationError as error:
            pytest.fail(f"{manifest['kind']} invalid for Kubernetes {version}: {error.message}")


async def run_hook(spawner: KubeSpawner, pod: Any) -> Any:
    """``modify_pod_hook`` as KubeSpawner calls it (it may be a coroutine function or not)."""
    result = spawner.modify_pod_hook(spawner, pod)
    return await result if inspect.isawaitable(result) else result


async def spawn(config: Config, user_options: dict[str, Any]) -> tuple[KubeSpawner, dict[str, Any]]:
    """Load the user's options, render the pod and run the pod hook, as a hub spawn does."""
    spawner = KubeSpawner(config=config, _mock=True)
    spawner.user_options = user_options
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    if spawner.modify_pod_hook:
        pod = await run_hook(spawner, pod)
    return spawner, SERIALIZER.sanitize_for_serialization(pod)


def server_claim(override: dict[str, Any], spawner: KubeSpawner, pod: dict[str, Any]) -> dict[str, Any]:
    """The claim a choice's after-create hook sends for this spawn: the body of the ServerClaim
    whose bound hook the choice's override holds."""
    server = override["after_pod_created_hook"].__self__
    return server.claim(spawner, {"metadata": {"name": pod["metadata"]["name"], "uid": "0000-uid"}})


async def test_a_dra_choice_attaches_a_claim_beside_kubespawners_resources() -> None:
    profiles = gpu_profiles(["4G", "8G"], "mps", preset="nvidia-dra", cores=50)
    config = Config({"KubeSpawner": {"profile_list": profiles, "mem_limit": "4G", "mem_guarantee": "1G"}})
    spawner, pod = await spawn(config, {"profile": "gpu", "gpu": "8g"})
    claim_name = f"{spawner.pod_name}-gpu"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim_name}]
    [notebook] = pod["spec"]["containers"]
    assert notebook["resources"]["claims"] == [{"name": "gpu"}]
    # KubeSpawner's own resources stay: the claim is added beside them.
    assert notebook["resources"]["limits"] == {"memory": 4 * 1024**3}
    assert notebook["resources"]["requests"] == {"memory": 1024**3}
    env = {item["name"]: item["value"] for item in notebook["env"]}
    assert env["JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER"] == "8192"
    validate(pod)
    claim = server_claim(
        profiles[0]["profile_options"]["gpu"]["choices"]["8g"]["kubespawner_override"], spawner, pod
    )
    assert claim["metadata"]["name"] == claim_name
    assert claim["metadata"]["ownerReferences"][0]["name"] == pod["metadata"]["name"]
    parameters = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert parameters["sharing"]["mpsConfig"] == {
        "defaultPinnedDeviceMemoryLimit": "8Gi",
        "defaultActiveThreadPercentage": 50,
    }
    validate(claim)


async def test_a_custom_size_makes_its_own_claim_on_each_spawn() -> None:
    profiles = gpu_profiles(["4G"], "vgpu", preset="hami-dra")
    custom = profiles[0]["profile_options"]["gpu"]["unlisted_choice"]["kubespawner_override"]
    config = Config({"KubeSpawner": {"profile_list": profiles}})
    first, first_pod = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "6G"})
    second, second_pod = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "10G"})
    assert first_pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": f"{first.pod_name}-gpu"}
    ]
    requests = [
        server_claim(custom, spawner, pod)["spec"]["devices"]["requests"][0]["exactly"]["capacity"][
            "requests"
        ]
        for spawner, pod in ((first, first_pod), (second, second_pod))
    ]
    assert requests == [{"memory": "6Gi"}, {"memory": "10Gi"}]
    assert server_claim(custom, first, first_pod)["metadata"]["annotations"] == {
        "jupyter-gpushare.io/size": "6G"
    }


async def test_the_admins_own_hooks_run_and_a_cpu_server_gets_no_claim() -> None:
    seen: list[str] = []

    def own_hook(spawner: Any, pod: Any) -> Any:
        seen.append("modify")
        pod.metadata.labels["team"] = "ml"
        return pod

    profiles = gpu_profiles(["4G"], "timeslice", preset="nvidia-dra")
    config = Config({"KubeSpawner": {"profile_list": profiles, "modify_pod_hook": own_hook}})
    spawner = KubeSpawner(config=config, _mock=True)
    for options, claims in (({"profile": "gpu", "gpu": "4g"}, True), ({"profile": "cpu"}, False)):
        spawner.user_options = options
        await spawner.load_user_options()
        pod = await run_hook(spawner, await spawner.get_pod_manifest())
        rendered = SERIALIZER.sanitize_for_serialization(pod)
        assert rendered["metadata"]["labels"]["team"] == "ml"
        assert ("resourceClaims" in rendered["spec"]) is claims
    assert seen == ["modify", "modify"]
    assert spawner.after_pod_created_hook is None


def test_yaml_profiles_refer_to_claim_templates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--preset", "nvidia-dra", "--mode", "mps", "--sizes", "4G,8G"]) == 0
    profile_list = yaml.safe_load(capsys.readouterr().out)
    assert profile_list == static_profiles(["4G", "8G"], "mps", preset="nvidia-dra")
    option = profile_list[0]["profile_options"]["gpu"]
    assert "unlisted_choice" not in option  # a template per typed-in value cannot exist beforehand
    overrides = option["choices"]["8g"]["kubespawner_override"]
    assert overrides["extra_pod_config"] == {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpushare-mps-8g"}]
    }
    assert overrides["extra_container_config"] == {"resources": {"claims": [{"name": "gpu"}]}}

    assert (
        main(["profiles", "--preset", "nvidia-dra", "--mode", "mps", "--sizes", "4G,8G", "--claim-templates"])
        == 0
    )
    templates = list(yaml.safe_load_all(capsys.readouterr().out))
    assert templates == claim_templates(["4G", "8G"], "mps", preset="nvidia-dra")
    assert [template["metadata"]["name"] for template in templates] == ["gpushare-mps-4g", "gpushare-mps-8g"]
    for template in templates:
        validate(template)


async def test_kubespawner_renders_the_yaml_profiles_pod() -> None:
    config = Config({"KubeSpawner": {"profile_list": static_profiles(["4G"], "vgpu", preset="hami-dra")}})
    _, pod = await spawn(config, {"profile": "gpu", "gpu": "4g"})
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpushare-vgpu-4g"}]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    validate(pod)


def test_claim_templates_need_a_dra_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--preset", "hami", "--claim-templates"]) == 2
    assert "--claim-templates needs a DRA preset" in capsys.readouterr().err
    assert main(["profiles", "--preset", "nvidia-dra"]) == 2  # the default mode, vgpu
    assert "has no vgpu" in capsys.readouterr().err
