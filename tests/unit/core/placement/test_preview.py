"""The dry run of a start (pure): what ``GET fit`` answers for the start picker, on a node's
ledger and on the watched cluster, each checked against what the real start decides."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.backends.kubernetes.objects.preview import preview_pod
from jupyter_gpushare.backends.local.inventory import Device, MigInstance
from jupyter_gpushare.core.placement.allocator import Held, Policy, Request, Spot, fit
from jupyter_gpushare.core.placement.preview import preview_start
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.sizes import GiB, parse_size

POOL = (
    Device(0, "GPU-0", "A100", 80 * GiB),
    Device(1, "GPU-1", "A100", 80 * GiB),
)
# GPU0: 70G held by bob; GPU1: 44G held by alice → 10G and 36G free.
HELD = (
    Held("k-bob", "bob", "GPU-0", "GPU-0", 70 * GiB),
    Held("k-alice", "alice", "GPU-1", "GPU-1", 44 * GiB),
)
MIG_POOL = (
    Device(
        0,
        "GPU-0",
        "A100",
        80 * GiB,
        mig=(MigInstance("MIG-a", "1g.10gb", 10 * GiB), MigInstance("MIG-b", "3g.40gb", 40 * GiB)),
    ),
)


def ask(size: str, placement: str = "shared", owner: str = "alice") -> Request:
    return Request("", owner, parse_size(size), placement)  # type: ignore[arg-type]


LOCAL_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (size, options, verdict, summary)
    ("8G", {}, "now", "fits now on GPU0, 10G free"),  # best fit: the fuller card
    ("20G", {}, "now", "fits now on GPU1, 36G free"),
    ("40G", {}, "queue", "queue position 1"),
    ("40G", {"queued_ahead": 2}, "queue", "queue position 3"),
    ("2G", {"queued_ahead": 1}, "queue", "queue position 2"),  # FIFO: it waits behind the queue
    ("40G", {"when_full": "fail"}, "full", "no room now"),
    ("96G", {}, "never", "larger than any card"),
    ("whole", {}, "queue", "queue position 1"),  # no card is free of other slices
    ("20G", {"policy": Policy(max_memory_per_kernel=16 * GiB)}, "never", "above the 16G limit per kernel"),
    (
        "8G",
        {"policy": Policy(max_memory_per_user=48 * GiB)},
        "never",
        "above your 48G budget: 44G already held",
    ),
    (
        "8G",
        {"policy": Policy(max_memory_per_user=48 * GiB), "owner": "carol"},
        "now",
        "fits now on GPU0, 10G free",
    ),
    ("25%", {}, "now", "fits now on GPU1, 36G free"),
]


@pytest.mark.parametrize(("size", "options", "verdict", "summary"), LOCAL_CASES)
def test_a_local_preview_says_where_when_or_why_not(
    size: str, options: dict[str, Any], verdict: str, summary: str
) -> None:
    request = ask(size, owner=options.get("owner", "alice"))
    policy = options.get("policy", Policy())
    preview = preview_start(
        request, POOL, HELD, options.get("queued_ahead", 0), policy, options.get("when_full", "queue")
    )
    assert (preview.verdict, preview.summary) == (verdict, summary)
    # The start decides the same: a placement exactly when the preview says "now" (an empty
    # queue), the same device and bytes; a refusal otherwise, for the same reason.
    outcome = fit(request, POOL, HELD, policy)
    if preview.verdict == "now":
        assert isinstance(outcome, Spot)
        assert (outcome.device_index, outcome.memory) == (preview.device, preview.memory)
    elif not options.get("queued_ahead"):
        assert not isinstance(outcome, Spot) and outcome.reason == preview.reason
    if preview.verdict == "queue":
        assert preview.queue_position == options.get("queued_ahead", 0) + 1


def test_a_local_preview_names_the_mig_instance_and_refuses_what_no_instance_holds() -> None:
    preview = preview_start(ask("8G", "mig"), MIG_POOL, (), 0, Policy())
    assert (preview.verdict, preview.summary) == ("now", "fits now on GPU0 (MIG 1g.10gb), 10G free")
    taken = (Held("k", "bob", "GPU-0", "MIG-a", 10 * GiB),)
    assert preview_start(ask("8G", "mig"), MIG_POOL, taken, 0, Policy()).summary.startswith(
        "fits now on GPU0 (MIG 3g.40gb)"
    )
    assert preview_start(ask("48G", "mig"), MIG_POOL, (), 0, Policy()).verdict == "never"


def test_an_empty_pool_can_never_start_anything() -> None:
    preview = preview_start(ask("2G"), (), (), 0, Policy())
    assert (preview.verdict, preview.summary) == ("never", "no GPU in the pool")


def test_the_json_answer_has_every_field_of_the_fit_schema() -> None:
    answer = preview_start(ask("8G"), POOL, HELD, 0, Policy()).as_json("8G")
    assert answer == {
        "gpu_memory": "8G",
        "verdict": "now",
        "summary": "fits now on GPU0, 10G free",
        "reason": None,
        "device": 0,
        "node": None,
        "free": 10 * GiB,
        "memory_request": 8 * GiB,
        "queue_position": None,
        "expected_start": None,
    }


def test_a_start_that_would_wait_says_how_long_where_an_estimate_is_given() -> None:
    full = (Held("k", "bob", "GPU-0", "GPU-0", 76 * GiB), Held("j", "bob", "GPU-1", "GPU-1", 80 * GiB))
    known = preview_start(ask("8G"), POOL, full, 1, Policy(), estimate=lambda: (1360.0, 1000.0))
    assert (known.summary, known.expected_start) == ("queue position 2, wait about 6 min", 1360.0)
    unknown = preview_start(ask("8G"), POOL, full, 0, Policy(), estimate=lambda: (None, 1000.0))
    assert unknown.summary == "queue position 1, wait unknown"
    fair = preview_start(ask("8G"), POOL, HELD, 2, Policy(), why_ahead="behind 2 under fair share")
    assert (fair.summary, fair.reason) == ("queue position 3", "behind 2 under fair share")


# ---- the Kubernetes backend -------------------------------------------------------------------

HAMI = resolve_preset("hami")


def hami_node(name: str, gib: int, card_gib: int = 80) -> NodeGPUs:
    return NodeGPUs(
        name=name,
        product="NVIDIA-A100",
        card_memory=card_gib * GiB,
        cards=None,
        sharing=None,
        replicas=None,
        memory_total=gib * GiB,
        allocatable={"nvidia.com/gpu": "10", "nvidia.com/gpumem": str(gib * 1024)},
    )


def pod(kernel_id: str, gib: int, node: str | None, owner: str = "alice", created: str = "1") -> PodSlice:
    return PodSlice(
        kernel_id=kernel_id,
        pod=f"kernel-{kernel_id}",
        owner=owner,
        server="s",
        mode="vgpu",
        size=f"{gib}G",
        memory=gib * GiB,
        node=node,
        phase="Running" if node else "Pending",
        created=created,
        unschedulable=None if node else "0/2 nodes are available",
        deleting=False,
    )


NODES = (hami_node("gpu-node-1", 40), hami_node("gpu-node-2", 40))
PODS = (pod("a", 36, "gpu-node-1"), pod("b", 4, "gpu-node-2", owner="bob"), pod("c", 30, None, owner="bob"))

K8S_CASES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("2G", "vgpu", {}, "now", "fits now on gpu-node-1, 4G free"),  # best fit
    ("8G", "vgpu", {}, "now", "fits now on gpu-node-2, 36G free"),
    ("38G", "vgpu", {}, "queue", "queue position 2"),  # behind the pod already waiting
    ("96G", "vgpu", {}, "never", "larger than any card"),
    ("8G", "vgpu", {"max_memory_per_user": 40 * GiB}, "never", "above your 40G budget: 36G already held"),
    ("8G", "vgpu", {"max_memory_per_kernel": 4 * GiB}, "never", "above the 4G limit per kernel"),
    ("8G", "mig", {}, "never", "no node offers mig"),
    ("50%", "vgpu", {}, "now", "fits now on gpu-node-2, 76G free"),  # a share of an 80G card: 40G
]


@pytest.mark.parametrize(("size", "mode", "limits", "verdict", "summary"), K8S_CASES)
def test_a_kernel_pod_preview_reads_the_watched_nodes(
    size: str, mode: str, limits: dict[str, Any], verdict: str, summary: str
) -> None:
    nodes = NODES if size != "50%" else (hami_node("gpu-node-2", 80),)
    preview = preview_pod(parse_size(size), mode, "alice", nodes, PODS, HAMI, **limits)
    assert (preview.verdict, preview.summary) == (verdict, summary)
    if verdict == "now":
        assert preview.node == summary.split()[3].rstrip(",")


def test_a_cluster_without_gpu_nodes_starts_nothing() -> None:
    preview = preview_pod(parse_size("2G"), "vgpu", "alice", (), (), HAMI)
    assert (preview.verdict, preview.summary) == ("never", "no GPU node in the cluster")
