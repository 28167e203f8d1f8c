"""KubeSpawner profiles from gpu_profiles(), through real KubeSpawner objects (its test mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubespawner import KubeSpawner
from traitlets.config import Config

from jupyter_gpushare.cli import main
from jupyter_gpushare.hub import (
    CUSTOM_SIZE_REGEX,
    budget_environment,
    budget_from_form,
    budget_options_form,
    gpu_profiles,
    static_profiles,
)

OFFLINE_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:9"}}]
contexts: [{name: offline, context: {cluster: offline, user: nobody, namespace: jupyter}}]
current-context: offline
users: [{name: nobody, user: {token: none}}]
"""


@pytest.fixture(autouse=True)
def offline_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # KubeSpawner builds its API client at construction; it never reaches this address here.
    # kubernetes_asyncio reads $KUBECONFIG once, at import, so point its default there.
    import kubernetes_asyncio.config.kube_config as kube_config

    config = tmp_path / "kubeconfig"
    config.write_text(OFFLINE_KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))


async def spawn(config: Config, user_options: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], Any]:
    """Load the user's options and render the pod, as a hub spawn would."""
    spawner = KubeSpawner(config=config, _mock=True)
    spawner.user_options = user_options
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    container = pod.spec.containers[0]
    env = {item.name: item.value for item in container.env if item.name.startswith("JUPYTER_GPUSHARE")}
    return container.resources.limits, env, pod


@pytest.mark.parametrize(
    ("mode", "preset", "choice", "limits"),
    [
        ("vgpu", "hami", "4g", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        ("vgpu", "hami", "whole", {"nvidia.com/gpu": "1"}),
        ("vgpu", "volcano", "8g", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8192"}),
        ("vgpu", "aliyun", "8g", {"aliyun.com/gpu-mem": "8"}),
        ("timeslice", "nvidia", "4g", {"nvidia.com/gpu": "1"}),
        ("exclusive", "nvidia", "8g", {"nvidia.com/gpu": "1"}),
        ("mig", "nvidia", "4g", {"nvidia.com/mig-1g.10gb": "1"}),
        ("mig", "nvidia", "16g", {"nvidia.com/mig-3g.40gb": "1"}),
    ],
)
async def test_every_choice_renders_a_pod_with_its_limits(
    mode: str, preset: str, choice: str, limits: dict[str, str]
) -> None:
    sizes = ["4G", "8G", "16G"] + (["whole"] if mode not in ("mig",) else [])
    profiles = gpu_profiles(sizes, mode, preset=preset, mig_profiles=["1g.10gb", "3g.40gb"])
    rendered, env, _ = await spawn(
        Config({"KubeSpawner": {"profile_list": profiles}}), {"profile": "gpu", "gpu": choice}
    )
    assert {name: value for name, value in rendered.items() if "." in name} == limits
    assert env["JUPYTER_GPUSHARE_DEFAULT_MODE"] == mode


async def test_hami_pods_use_its_scheduler_and_tell_the_server_its_budget() -> None:
    profiles = gpu_profiles(["4G", "8G"], "vgpu", preset="hami", cores=30)
    limits, env, pod = await spawn(
        Config({"KubeSpawner": {"profile_list": profiles}}), {"profile": "gpu", "gpu": "8g"}
    )
    assert pod.spec.scheduler_name == "hami-scheduler"
    assert limits["nvidia.com/gpucores"] == "30"
    assert env["JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER"] == "8192"


async def test_two_custom_sizes_in_a_row_on_one_configuration() -> None:
    # One hub configuration, one profile list object, two spawns: each gets its own value.
    config = Config({"KubeSpawner": {"profile_list": gpu_profiles(["4G"], "vgpu")}})
    first, first_env, _ = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "6G"})
    second, second_env, _ = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "10G"})
    assert first["nvidia.com/gpumem"] == "6144"
    assert second["nvidia.com/gpumem"] == "10240"
    assert (
        first_env["JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER"],
        second_env["JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER"],
    ) == (
        "6144",
        "10240",
    )
    third, _, _ = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "512M"})
    assert third["nvidia.com/gpumem"] == "512"


@pytest.mark.parametrize("bad", ["abc", "-1G", "10T", "%", "6 G B"])
async def test_a_bad_custom_size_is_refused(bad: str) -> None:
    config = Config({"KubeSpawner": {"profile_list": gpu_profiles(["4G"], "vgpu")}})
    with pytest.raises(ValueError, match="failed validation regex"):
        await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": bad})


@pytest.mark.parametrize("good", ["6G", "6g", "6GB", "6GiB", "0.5G", "512M", "512MB", "512MiB", "4096"])
def test_the_custom_regex_accepts_the_spec_forms(good: str) -> None:
    import re

    assert re.match(CUSTOM_SIZE_REGEX, good)


def test_bad_profile_arguments_fail_at_hub_start() -> None:
    with pytest.raises(ValueError, match="cannot read GPU size 'abc'"):
        gpu_profiles(["abc"], "vgpu")
    with pytest.raises(ValueError, match="default size"):
        gpu_profiles(["4G"], "vgpu", default="8G")


def test_the_cli_prints_yaml_kubespawner_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--sizes", "4G,8G", "--mode", "vgpu", "--preset", "hami"]) == 0
    profile_list = yaml.safe_load(capsys.readouterr().out)
    assert profile_list == static_profiles(["4G", "8G"], "vgpu", preset="hami")
    custom = profile_list[0]["profile_options"]["gpu"]["unlisted_choice"]
    assert custom["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpumem"] == "{value}"


async def test_yaml_profiles_render_pods_for_two_custom_values() -> None:
    config = Config({"KubeSpawner": {"profile_list": static_profiles(["4G"], "vgpu")}})
    first, _, _ = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "6144"})
    second, _, _ = await spawn(config, {"profile": "gpu", "gpu--unlisted-choice": "2048"})
    assert (first["nvidia.com/gpumem"], second["nvidia.com/gpumem"]) == ("6144", "2048")


def test_the_cli_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--sizes", "4G,abc"]) == 2
    assert "accepted forms" in capsys.readouterr().err


def test_budget_form_for_any_spawner() -> None:
    form = budget_options_form(["4G", "8G"], default="8G")
    assert '<option value="8G" selected>' in form
    assert budget_from_form({"gpu_budget": ["4G"]}, ["4G", "8G"]) == {"gpu_budget": "4G"}
    with pytest.raises(ValueError, match="not one of"):
        budget_from_form({"gpu_budget": ["64G"]}, ["4G", "8G"])
    assert budget_environment({"gpu_budget": "8G"}, "/srv/ledger.sqlite") == {
        "JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER": "8G",
        "JUPYTER_GPUSHARE_LEDGER_PATH": "/srv/ledger.sqlite",
    }


# -- Kueue: a GPU profile's servers wait in a LocalQueue ----------------------------------------

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.mark.parametrize("choice", [{"gpu": "8g"}, {"gpu": "unlisted_choice", "gpu--unlisted-choice": "6G"}])
async def test_a_profile_naming_a_local_queue_labels_its_gpu_servers_for_kueue(
    choice: dict[str, str],
) -> None:
    """Each team's profile its own LocalQueue (two gpu_profiles lists, one CPU profile); a listed
    and a custom size alike. The CPU profile's server asks for no GPU and is not queued."""
    team_a = gpu_profiles(["4G", "8G"], "vgpu", slug="team-a", kueue_queue="team-a", cpu_profile=False)
    team_b = gpu_profiles(["4G", "8G"], "vgpu", slug="team-b", kueue_queue="team-b")
    config = Config({"KubeSpawner": {"profile_list": [*team_a, *team_b]}})
    for team in ("team-a", "team-b"):
        limits, env, pod = await spawn(config, {"profile": team, **choice})
        assert pod.metadata.labels[QUEUE_LABEL] == team
        assert limits["nvidia.com/gpu"] == "1" and env["JUPYTER_GPUSHARE_DEFAULT_MODE"] == "vgpu"
        assert pod.spec.scheduler_name == "hami-scheduler"  # the preset's own settings stay
    _, _, cpu = await spawn(config, {"profile": "cpu"})
    assert QUEUE_LABEL not in (cpu.metadata.labels or {})
    _, _, unqueued = await spawn(
        Config({"KubeSpawner": {"profile_list": gpu_profiles(["8G"])}}), {"gpu": "8g"}
    )
    assert QUEUE_LABEL not in (unqueued.metadata.labels or {})


@pytest.mark.parametrize("bad", ["Team-A", "team_a", "-gpu", "a" * 64])
def test_a_bad_local_queue_name_fails_at_hub_start_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError) as refused:
        gpu_profiles(["8G"], kueue_queue=bad)
    assert str(refused.value) == (
        f"kueue_queue: {bad!r} is not a LocalQueue name (lowercase letters, digits, '-' and '.', "
        "starting and ending with a letter or digit, at most 63 characters)"
    )


async def test_yaml_profiles_name_the_local_queue_too(capsys: pytest.CaptureFixture[str]) -> None:
    """``jupyter gpushare profiles --kueue-queue``: a listed and a typed-in custom size alike."""
    assert main(["profiles", "--sizes", "4G,8G", "--kueue-queue", "team-a"]) == 0
    profiles = yaml.safe_load(capsys.readouterr().out)
    config = Config({"KubeSpawner": {"profile_list": profiles}})
    for choice in ({"gpu": "4g"}, {"gpu": "unlisted_choice", "gpu--unlisted-choice": "6144"}):
        limits, _, pod = await spawn(config, {"profile": "gpu", **choice})
        assert pod.metadata.labels[QUEUE_LABEL] == "team-a", choice
        assert limits["nvidia.com/gpu"] == "1"
    assert main(["profiles", "--kueue-queue", "Team A"]) == 2
    assert capsys.readouterr().err.strip() == (
        "jupyter gpushare: error: --kueue-queue: 'Team A' is not a LocalQueue name (lowercase "
        "letters, digits, '-' and '.', starting and ending with a letter or digit, at most 63 characters)"
    )


# ---- a queued server's spawn progress (Kueue) ----------------------------------------------------


async def test_a_queued_choice_tells_kueues_words_after_its_own_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_profiles(kueue_queue=…): a GPU choice's after_pod_created_hook runs the choice's own hook
    (a DRA claim's) first, then starts the hub's task that tells Kueue's words for that very pod;
    a choice without a queue has no such hook."""
    import asyncio
    from types import SimpleNamespace

    from jupyter_gpushare.backends.kubernetes.cluster import spawner_kueue
    from jupyter_gpushare.backends.kubernetes.cluster.spawner_kueue import told_while_queued

    calls: list[tuple[str, ...]] = []

    async def telling(client: Any, namespace: str, pod: str, uid: str, timeout: float) -> None:
        calls.append(("tell", namespace, pod, uid, str(timeout)))

    monkeypatch.setattr(spawner_kueue, "tell_while_queued", telling)

    def claim_hook(spawner: Any) -> Any:
        async def claim(spawner: Any, pod: Any) -> None:
            calls.append(("claim", pod["metadata"]["name"]))

        return claim

    spawner = SimpleNamespace(
        api=SimpleNamespace(api_client=None), namespace="jupyter", start_timeout=60, config=None
    )
    hook = told_while_queued(claim_hook)(spawner)
    await hook(spawner, {"metadata": {"name": "jupyter-alice", "uid": "u1"}})
    await asyncio.gather(*spawner_kueue._telling)
    assert calls == [("claim", "jupyter-alice"), ("tell", "jupyter", "jupyter-alice", "u1", "60")]

    queued = gpu_profiles(["4G"], "vgpu", preset="hami", kueue_queue="gpu")
    plain = gpu_profiles(["4G"], "vgpu", preset="hami")
    [choice] = queued[0]["profile_options"]["gpu"]["choices"].values()
    assert callable(choice["kubespawner_override"]["after_pod_created_hook"])
    [choice] = plain[0]["profile_options"]["gpu"]["choices"].values()
    assert "after_pod_created_hook" not in choice["kubespawner_override"]
    # A CPU server after a queued GPU one has the admin's hook again (a spawner outlives a spawn).
    assert "after_pod_created_hook" in queued[1]["kubespawner_override"]
