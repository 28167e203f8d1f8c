"""The Kubernetes pool as the API shows it: nodes, kernel pods, quotas and HAMi metrics (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.pool import (
    PodSlice,
    Usage,
    epoch_seconds,
    held_by_user,
    kernel_view,
    never_fits,
    node_modes,
    pool_view,
    read_node,
    read_pod,
)
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.backends.kubernetes.objects.usage import MetricsFormatError, pod_memory_used
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.placement.allocator import user_limit_refusal
from jupyter_gpushare.core.sizes import GiB, MiB
from jupyter_gpushare.core.slice_request import make_slice_request

NVIDIA = resolve_preset("nvidia")
HAMI = resolve_preset("hami")


def node(name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", **allocatable}},
    }


def gfd(
    product: str, memory_mib: int, count: int, sharing: str = "none", replicas: int = 1
) -> dict[str, str]:
    return {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.sharing-strategy": sharing,
        "nvidia.com/gpu.replicas": str(replicas),
    }


def pod(
    kernel_id: str,
    owner: str = "alice",
    memory: str = "6G",
    mode: str = "vgpu",
    node_name: str | None = "gpu-1",
    phase: str = "Running",
    created: str = "2026-11-29T10:00:00Z",
    server: str = "alice@jupyter-alice",
) -> dict[str, Any]:
    settings = GPUShare(resource_preset="hami")
    manifest, _ = kernel_pod(
        settings,
        kernel_id=kernel_id,
        server_id=server,
        owner=owner,
        request=make_slice_request(memory, mode, None, "4G", "timeslice"),
        cluster=cluster_facts(settings, gpu_memory=80 * GiB),
    )
    manifest["metadata"]["creationTimestamp"] = created
    if node_name:
        manifest["spec"]["nodeName"] = node_name
    manifest["status"] = {"phase": phase}
    return manifest


# ---- nodes ---------------------------------------------------------------------------------------


def test_a_device_plugin_node_is_read_from_its_feature_discovery_labels() -> None:
    read = read_node(node("gpu-1", {"nvidia.com/gpu": "4"}, gfd("NVIDIA-A100-SXM4-80GB", 81920, 4)), NVIDIA)
    assert read is not None
    assert (read.cards, read.card_memory, read.memory_total) == (4, 80 * GiB, 320 * GiB)
    assert read.allocatable == {"nvidia.com/gpu": "4"}  # cpu and memory are not GPU resources
    assert node_modes(read, NVIDIA) == ["exclusive"]


def test_a_time_sliced_node_counts_cards_not_replicas() -> None:
    labels = gfd("NVIDIA-L4", 23034, 2, "time-slicing", 4)
    del labels["nvidia.com/gpu.count"]  # older GFD: cards follow from replicas
    read = read_node(node("l4", {"nvidia.com/gpu": "8"}, labels), NVIDIA)
    assert read is not None and read.cards == 2 and read.memory_total == 2 * 23034 * MiB
    assert node_modes(read, NVIDIA) == ["timeslice"]
    renamed = resolve_preset("nvidia", {"timeslice_gpu": "nvidia.com/gpu.shared"})
    shared = read_node(
        node("l4", {"nvidia.com/gpu.shared": "8"}, gfd("NVIDIA-L4", 23034, 2, "none")), renamed
    )
    assert shared is not None and node_modes(shared, renamed) == ["timeslice"]
    mps = read_node(node("m", {"nvidia.com/gpu": "8"}, gfd("NVIDIA-L4", 23034, 2, "mps", 4)), NVIDIA)
    assert mps is not None and node_modes(mps, NVIDIA) == ["mps"]


def test_a_mig_node_offers_its_profiles_and_their_memory() -> None:
    read = read_node(node("mig", {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "0"}), NVIDIA)
    assert read is not None
    assert read.mig == {"1g.10gb": 7}  # a profile with none left is not offered
    assert read.memory_total == 70 * GiB
    assert node_modes(read, NVIDIA) == ["mig"]


def test_a_hami_node_offers_its_virtual_memory_and_no_whole_cards() -> None:
    allocatable = {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "163840", "nvidia.com/gpucores": "200"}
    read = read_node(node("hami", allocatable, {"nvidia.com/gpu.product": "NVIDIA-H100"}), HAMI)
    assert read is not None
    assert read.memory_total == 160 * GiB and read.cards is None  # 20 vGPUs are not 20 cards
    assert node_modes(read, HAMI) == ["vgpu"]
    aliyun = resolve_preset("aliyun")
    cgpu = read_node(node("ali", {"aliyun.com/gpu-mem": "48"}), aliyun)
    assert cgpu is not None and cgpu.memory_total == 48 * GiB and node_modes(cgpu, aliyun) == ["vgpu"]


def test_a_node_without_gpus_is_no_device() -> None:
    assert read_node(node("cpu-only", {}), NVIDIA) is None
    assert read_node(node("drained", {"nvidia.com/gpu": "0"}), NVIDIA) is None


# ---- pods ----------------------------------------------------------------------------------------


def test_a_kernel_pod_is_read_back_from_what_the_builder_made() -> None:
    item = read_pod(pod("k-1"))
    assert item is not None
    assert (item.kernel_id, item.owner, item.mode, item.size, item.memory) == (
        "k-1",
        "alice",
        "vgpu",
        "6G",
        6 * GiB,
    )
    assert item.placed and not item.ended and item.node == "gpu-1"
    assert epoch_seconds(item.created) == 1795946400.0  # date -d 2026-11-29T10:00:00Z +%s
    assert epoch_seconds("not a time") == 0.0
    assert read_pod({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "nginx"}]}}) is None


def test_an_unschedulable_pod_carries_the_schedulers_message() -> None:
    waiting = pod("k-2", node_name=None, phase="Pending")
    waiting["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available",
        }
    ]
    item = read_pod(waiting)
    assert item is not None and item.unschedulable == "0/4 nodes are available" and not item.placed


def test_the_per_user_quota_counts_every_live_pod_of_the_user() -> None:
    slices = [
        s
        for s in map(
            read_pod,
            [
                pod("a", memory="6G"),
                pod("b", memory="8G", node_name=None, phase="Pending", server="alice@laptop"),
                pod("c", memory="10G", phase="Failed"),
                pod("d", memory="20G", owner="bob"),
            ],
        )
        if s is not None
    ]
    assert held_by_user(slices, "alice") == 14 * GiB
    assert held_by_user(slices, "alice", excluding="a") == 8 * GiB
    pods = " by their kernel pods"
    assert user_limit_refusal("alice", 4 * GiB, 14 * GiB, 18 * GiB, pods) is None
    assert user_limit_refusal("alice", 6 * GiB, 14 * GiB, 16 * GiB, pods) == (
        "6G would take alice to 20G, above the per-user limit of 16G (14G already held by their kernel pods)"
    )
    assert user_limit_refusal("alice", 100 * GiB, 0, None) is None


def test_a_slice_larger_than_every_card_never_fits() -> None:
    nodes = [
        n
        for n in (
            read_node(node("a", {"nvidia.com/gpu": "4"}, gfd("A100", 81920, 4)), NVIDIA),
            read_node(node("b", {"nvidia.com/gpu": "1"}, gfd("L4", 23034, 1)), NVIDIA),
        )
        if n is not None
    ]
    assert never_fits(80 * GiB, nodes) is None
    assert never_fits(81 * GiB, nodes) == (
        "81G does not fit on any GPU node of the cluster: the largest card has 80G"
    )
    assert never_fits(10**15, []) is None  # nothing known: the scheduler decides


# ---- views ---------------------------------------------------------------------------------------


def test_the_pool_shows_nodes_reservations_usage_and_the_queue_others_anonymous() -> None:
    allocatable = {"nvidia.com/gpu": "10", "nvidia.com/gpumem": "81920"}
    nodes = [n for n in (read_node(node("gpu-1", allocatable), HAMI),) if n is not None]
    slices: list[PodSlice] = [
        s
        for s in map(
            read_pod,
            [
                pod("mine", memory="6G"),
                pod("theirs", owner="bob", memory="10G"),
                pod("late", memory="50G", node_name=None, phase="Pending", created="2026-11-29T10:05:00Z"),
                pod("early", owner="bob", memory="70G", node_name=None, phase="Pending"),
            ],
        )
        if s is not None
    ]
    usage = {"mine": Usage(5 * GiB, 30, "kernel"), "theirs": Usage(1 * GiB, None, "hami")}
    view = pool_view(nodes, slices, HAMI, usage, viewer="alice")
    [device] = view["devices"]
    assert device["memory_total"] == 80 * GiB
    assert device["memory_reserved"] == 16 * GiB and device["memory_used"] == 6 * GiB
    assert [(e["position"], e["kernel_id"], e["owner"]) for e in view["queue"]] == [
        (1, None, "another user"),
        (2, "late", "alice"),
    ]
    mine = kernel_view(
        slices[0], nodes, slices, usage["mine"], viewer="alice", kernel_name="k", path="a.ipynb"
    )
    assert (mine["state"], mine["device"], mine["memory_used"], mine["usage_source"]) == (
        "running",
        0,
        5 * GiB,
        "kernel",
    )
    assert mine["warnings"] == []
    late = kernel_view(slices[2], nodes, slices, None, viewer="alice")
    assert (late["state"], late["queue_position"], late["detail"]) == ("queued", 2, "pod pending")
    theirs = kernel_view(slices[1], nodes, slices, usage["theirs"], viewer="alice")
    assert theirs["kernel_id"] is None and theirs["owner"] == "another user" and theirs["pod"] is None
    over = kernel_view(slices[0], nodes, slices, Usage(7 * GiB, None, "kernel"), viewer="alice")
    assert over["warnings"] == ["above its slice: using 7G of 6G (117%)"]


def test_a_problem_reading_the_cluster_is_part_of_the_pool() -> None:
    assert pool_view([], [], HAMI, {}, viewer="a", problem="forbidden")["problem"] == "forbidden"
    assert "problem" not in pool_view([], [], HAMI, {}, viewer="a")


# ---- HAMi metrics ----------------------------------------------------------------------------------

METRICS = """\
# HELP vGPU_device_memory_usage_in_bytes The vGPU memory a container uses
# TYPE vGPU_device_memory_usage_in_bytes gauge
vGPU_device_memory_usage_in_bytes{podname="pod-a",podnamespace="kernels",vdeviceid="0"} 1.073741824e+09
vGPU_device_memory_usage_in_bytes{podname="pod-a",podnamespace="kernels",vdeviceid="1"} 1073741824
vGPU_device_memory_usage_in_bytes{podname="pod-a",podnamespace="other",vdeviceid="0"} 5
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{pod="pod-b",namespace="kernels"} 3
# TYPE unrelated gauge
unrelated{podname="pod-c",podnamespace="kernels"} 7
"""


def test_hami_metrics_give_each_pods_memory_in_its_namespace() -> None:
    assert pod_memory_used(METRICS, "kernels") == {"pod-a": 2 * GiB, "pod-b": 3}
    assert pod_memory_used(METRICS, "kernels", ["unrelated"]) == {"pod-c": 7}
    assert pod_memory_used("", "kernels") == {}


@pytest.mark.parametrize("text", ["this is { not metrics", "a b c", 'm{podname="p"} many'])
def test_text_that_is_not_metrics_is_refused_clearly(text: str) -> None:
    with pytest.raises(MetricsFormatError, match="not Prometheus metrics"):
        pod_memory_used(text, "kernels")


def test_a_pod_kueue_holds_is_in_the_pools_queue_saying_so() -> None:
    """A pod behind Kueue's admission gate has no scheduler's words (the scheduler never saw it):
    its queue entry says Kueue holds it, and in which LocalQueue."""
    from dataclasses import replace

    nodes = [n for n in (read_node(node("gpu-1", {"nvidia.com/gpu": "10"}), HAMI),) if n is not None]
    [item] = [s for s in map(read_pod, [pod("gated", memory="6G", node_name=None, phase="Pending")]) if s]
    held = replace(item, held_by_kueue="team-a")
    [entry] = pool_view(nodes, [held], HAMI, {}, viewer="alice")["queue"]
    assert entry["reason"] == "queued by Kueue in LocalQueue team-a: waiting for its admission"
    [entry] = pool_view(nodes, [item], HAMI, {}, viewer="alice")["queue"]
    assert entry["reason"] is None  # neither the scheduler nor Kueue has said anything yet
