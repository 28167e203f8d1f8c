"""Pod requests by mode and resource preset: the docs/how-it-works/modes.md table row by row, MIG profiles,
resource name overrides, shares of a card, and what a preset cannot ask for (the golden table is
in k8s_pods.py)."""

from __future__ import annotations

import itertools

import pytest

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.dialects import kernel_request
from jupyter_gpushare.backends.kubernetes.objects.presets import (
    DEVICE_PLUGIN_PRESETS,
    PresetError,
    resolve_preset,
)
from jupyter_gpushare.core.errors import InvalidRequestError, ModeUnavailableError
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.sizes import GiB, parse_size
from tests.support.k8s_pods import (
    GOLDEN,
    KERNEL_ID,
    MIG_PROFILES,
    MODES,
    NO_CORES,
    OWNER,
    SERVER_ID,
    build,
    container,
    env_of,
    golden_cores,
    request_for,
    settings,
    validate,
)


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
    assert timeslice["CUPY_GPU_MEMORY_LIMIT"] == "5637144576"  # 6G less the CUDA context allowance
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
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2406"  # (20G - 768M) / 80G


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
    request = kernel_request("mig", parse_size("8G"), None, facts)
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
        kernel_request("mig", parse_size("6G"), None, no_profiles)
    facts = ClusterFacts(resolve_preset("nvidia"), mig_profiles=MIG_PROFILES)
    with pytest.raises(
        InvalidRequestError,
        match=r"81G is larger than any MIG profile the cluster offers "
        r"\(3g\.40gb, 1g\.10gb, 7g\.80gb, 2g\.20gb\)",
    ):
        kernel_request("mig", parse_size("81G"), None, facts)
    with pytest.raises(InvalidRequestError, match="'whole' is not a MIG size; use mode 'exclusive'"):
        kernel_request("mig", parse_size("whole"), None, facts)


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
        kernel_request("vgpu", parse_size("6G"), None, facts)
