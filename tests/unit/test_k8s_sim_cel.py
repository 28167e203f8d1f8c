"""The node simulator's CEL evaluator (tests/integration/k8s_sim/cel.py) on its own.

The DRA allocator of the simulator matches claims to devices with it, so every selector the
claim builders emit must compile and mean there what it means in Kubernetes; what is outside the
subset must fail loudly rather than match by accident.
"""

from __future__ import annotations

import pytest

from jupyter_gpushare.k8s.claims import memory_at_least, product_is, profile_is
from jupyter_gpushare.k8s.presets import PRESETS, DraNames
from jupyter_gpushare.sizes import GiB
from tests.cluster.dra_devices import HAMI, NVIDIA, device_class, hami_gpu, nvidia_gpu, nvidia_mig
from tests.integration.k8s_sim.cel import CelError, Quantity, compile_selector, device_view

NVIDIA_NAMES = PRESETS["nvidia-dra"].dra
HAMI_NAMES = PRESETS["hami-dra"].dra
assert isinstance(NVIDIA_NAMES, DraNames) and isinstance(HAMI_NAMES, DraNames)

A100 = device_view(NVIDIA, nvidia_gpu(0))  # 80Gi, "NVIDIA A100-SXM4-80GB"
MIG_1G = device_view(NVIDIA, nvidia_mig(0, "1g.10gb", 0))
HAMI_A100 = device_view(HAMI, hami_gpu(0))


@pytest.mark.parametrize(
    ("expression", "device", "matches"),
    [
        (memory_at_least(NVIDIA_NAMES, 6 * GiB), A100, True),
        (memory_at_least(NVIDIA_NAMES, 80 * GiB), A100, True),
        (memory_at_least(NVIDIA_NAMES, 81 * GiB), A100, False),
        (memory_at_least(NVIDIA_NAMES, 12 * GiB), MIG_1G, False),  # a 1g.10gb has 10Gi
        (memory_at_least(HAMI_NAMES, 24 * GiB), HAMI_A100, True),
        (memory_at_least(HAMI_NAMES, 24 * GiB), A100, False),  # another driver's capacity: absent
        (product_is(NVIDIA_NAMES, "A100"), A100, True),
        (product_is(NVIDIA_NAMES, "a100"), A100, True),  # any case, as HAMi's use-gputype
        (product_is(NVIDIA_NAMES, "H100"), A100, False),
        (profile_is(NVIDIA_NAMES, "1g.10gb"), MIG_1G, True),
        (profile_is(NVIDIA_NAMES, "3g.40gb"), MIG_1G, False),
        (profile_is(NVIDIA_NAMES, "1g.10gb"), A100, False),  # a full GPU has no profile: false
        (
            device_class("gpu.nvidia.com", NVIDIA, "gpu")["spec"]["selectors"][0]["cel"]["expression"],
            A100,
            True,
        ),
        (
            device_class("mig.nvidia.com", NVIDIA, "mig")["spec"]["selectors"][0]["cel"]["expression"],
            A100,
            False,
        ),
        (
            "!(device.driver == 'gpu.nvidia.com') || device.attributes['gpu.nvidia.com'].type != 'gpu'",
            A100,
            False,
        ),
        ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")', A100, True),
        ('device.attributes["gpu.nvidia.com"].productName.endsWith("80GB")', MIG_1G, True),
    ],
)
def test_selectors_the_builders_emit_mean_what_kubernetes_means(
    expression: str, device: dict[str, object], matches: bool
) -> None:
    assert compile_selector(expression)(device) is matches


@pytest.mark.parametrize(
    "expression",
    [
        "device.attributes.exists(a, a == 'x')",  # a macro: outside the subset
        "1 + 2 == 3",  # arithmetic
        "device.driver == 'gpu.nvidia.com' &&",  # malformed
        "device.driver.size() > 3",  # a method the subset lacks
    ],
)
def test_an_expression_outside_the_subset_fails_loudly(expression: str) -> None:
    with pytest.raises(CelError):
        compile_selector(expression)(A100)


def test_a_selector_must_be_boolean() -> None:
    with pytest.raises(CelError, match="expected a boolean"):
        compile_selector("device.driver")(A100)


@pytest.mark.parametrize(
    ("text", "value"),
    [("80Gi", 80 * GiB), ("1536Mi", 1536 * 2**20), ("6G", 6 * 10**9), ("100", 100), ("1.5Gi", 3 * GiB // 2)],
)
def test_quantities(text: str, value: int) -> None:
    assert Quantity.parse(text) == Quantity(value)


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(CelError, match="not a quantity"):
        Quantity.parse("lots")
