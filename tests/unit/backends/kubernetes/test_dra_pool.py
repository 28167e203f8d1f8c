"""Reading the DRA pool: quantities, ResourceSlices and allocated claims as the API sends them."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.dra_pool import (
    ClaimUse,
    dra_nodes,
    facts_from_slices,
    parse_quantity,
    read_claims,
    read_slices,
    with_allocated_modes,
)
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice
from jupyter_gpushare.backends.kubernetes.objects.presets import PRESETS
from jupyter_gpushare.core.sizes import GiB, MiB

NVIDIA = PRESETS["nvidia-dra"]
assert NVIDIA.dra is not None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * GiB),
        ("81920Mi", 80 * GiB),
        ("85899345920", 80 * GiB),
        ("1.5Gi", 3 * GiB // 2),
        ("2G", 2 * 10**9),
        ("100", 100),
        ("500m", 0),
        ("", None),
        ("Gi", None),
        ("12Qi", None),
        ("1e3", 1000),
    ],
)
def test_quantities(text: str, value: int | None) -> None:
    assert parse_quantity(text) == value


def slice_of(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def gpu(
    name: str, memory: str, shared: bool = False, device_type: str = "gpu", profile: str | None = None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": device_type},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
    }
    if profile:
        attributes["profile"] = {"string": profile}
    device: dict[str, Any] = {
        "name": name,
        "attributes": attributes,
        "capacity": {"memory": {"value": memory}},
    }
    if shared:
        device["allowMultipleAllocations"] = True
    return device


SLICES = [
    slice_of("a", "gpu.nvidia.com", [gpu("gpu-0", "80Gi", shared=True), gpu("gpu-1", "40Gi")]),
    slice_of("b", "gpu.nvidia.com", [gpu("mig-0", "10Gi", device_type="mig", profile="1g.10gb")]),
    slice_of("c", "other.example.com", [gpu("x", "16Gi")]),  # another driver's: not ours to show
    {"spec": {"driver": "gpu.nvidia.com", "allNodes": True, "devices": [gpu("net", "1Gi")]}},  # no node
]


def claim(name: str, results: list[dict[str, Any]], kernel: str | None = None) -> dict[str, Any]:
    labels = {"jupyter-gpushare.io/kernel-id": kernel, "jupyter-gpushare.io/owner": "bob"} if kernel else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


def result(device: str, pool: str, request: str = "gpu", memory: str | None = None) -> dict[str, Any]:
    found = {"request": request, "driver": "gpu.nvidia.com", "pool": pool, "device": device}
    if memory:
        found["consumedCapacity"] = {"memory": memory}
    return found


def test_devices_claims_and_nodes_from_dra_objects() -> None:
    devices = read_slices(SLICES, NVIDIA.dra)
    assert [(device.node, device.name, device.memory, device.shared) for device in devices] == [
        ("a", "gpu-0", 80 * GiB, True),
        ("a", "gpu-1", 40 * GiB, False),
        ("b", "mig-0", 10 * GiB, False),
    ]
    assert facts_from_slices(devices) == (["1g.10gb"], 40 * GiB, True)
    uses = read_claims(
        [
            claim("k1-gpu-0", [result("gpu-0", "a", memory="6Gi")], kernel="k1"),
            claim("theirs", [result("gpu-0", "a", memory="10240Mi")]),
            claim("whole", [result("gpu-1", "a")]),
            claim("mig", [result("mig-0", "b", request="gpu/mig")], kernel="k2"),
            claim("pending", []),
        ],
        NVIDIA.dra,
    )
    assert [use.name for use in uses] == ["k1-gpu-0", "theirs", "whole", "mig"]
    assert uses[0] == ClaimUse("ns", "k1-gpu-0", "k1", "bob", None, (("a", "gpu-0", 6 * GiB),))
    assert uses[3].mode == "mig"
    a, b = dra_nodes(devices, uses, NVIDIA)
    # Consumed shares count what they consumed; a claim without shares holds its whole device.
    assert (a.name, a.memory_total, a.claimed, a.cards) == ("a", 120 * GiB, 16 * GiB + 40 * GiB, 2)
    assert a.offered_modes == ("exclusive", "mps", "timeslice")  # the registry's order
    assert (b.name, b.memory_total, b.claimed, b.cards, b.mig) == (
        "b",
        10 * GiB,
        10 * GiB,
        None,
        {"1g.10gb": 1},
    )
    assert b.offered_modes == ("mig",)
    assert 10240 * MiB == 10 * GiB

    pods = [
        PodSlice("k2", "p2", "bob", "s", "mig", "6G", 6 * GiB, "b", "Running", "t", None, False),
        PodSlice("k3", "p3", "bob", "s", "mps", "6G", 6 * GiB, "a", "Running", "t", None, False),
    ]
    assert [item.mode for item in with_allocated_modes(pods, uses)] == ["mig", "mps"]


def test_a_kernel_pod_is_told_the_mode_its_claim_got() -> None:
    from jupyter_gpushare.kernel.display import PodSliceStatus

    view = {"mode": "mps", "memory_request": 6 * GiB, "pod": "p", "node": "gpu-node-1"}
    status = PodSliceStatus("mig", 6 * GiB, view)
    assert (
        status.lines()[0]
        == "GPU slice: 6G (mps, a fallback of the mig asked for) in pod p on node gpu-node-1"
    )
    same = PodSliceStatus("mig", 6 * GiB, {**view, "mode": "mig"})
    assert same.lines()[0] == "GPU slice: 6G (mig) in pod p on node gpu-node-1"
