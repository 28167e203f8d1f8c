"""The watchdog's verdicts and the attribution of GPU processes to kernels (pure)."""

from __future__ import annotations

import pytest

from jupyter_gpushare.backends.local.usage.attribution import ProcessUsage, attribute
from jupyter_gpushare.core.sizes import GiB
from jupyter_gpushare.core.watchdog import DeviceUsage, KernelUsage, assess

DEVICE = DeviceUsage("GPU0", 80 * GiB, memory_used=None, utilization=None)


def kernel(used: int | None, utilization: int | None = None, memory: int = 4 * GiB) -> KernelUsage:
    return KernelUsage("k", memory, used, utilization)


@pytest.mark.parametrize(
    ("used", "expected", "over"),
    [
        (None, [], False),
        (int(3.5 * GiB), [], False),  # 87.5%: quiet
        (int(3.7 * GiB), ["near its slice: using 3.7G of 4G (92%)"], False),
        (4 * GiB, ["near its slice: using 4G of 4G (100%)"], False),
        (5 * GiB, ["above its slice: using 5G of 4G (125%)"], True),
    ],
)
def test_memory_thresholds(used: int | None, expected: list[str], over: bool) -> None:
    verdict = assess(kernel(used), DEVICE, [], overcommit=1.0)
    assert list(verdict.warnings) == expected
    assert verdict.over_limit is over


def test_saturation_names_own_and_neighbours_share() -> None:
    busy = DeviceUsage("GPU1", 80 * GiB, None, utilization=97)
    neighbours = [kernel(0, 30), kernel(0, 27)]
    verdict = assess(kernel(0, 40), busy, neighbours, 1.0)
    assert verdict.warnings == ("GPU1 is saturated (97% busy): this kernel 40%, 2 other kernels 57%",)


def test_saturation_with_unknown_own_share() -> None:
    verdict = assess(kernel(0, None), DeviceUsage("GPU0", 80 * GiB, None, 90), [], 1.0)
    assert verdict.warnings == ("GPU0 is saturated (90% busy): this kernel unknown, 0 other kernels 0%",)


def test_below_saturation_is_quiet() -> None:
    assert assess(kernel(0, 80), DeviceUsage("GPU0", 80 * GiB, None, 89), [], 1.0).warnings == ()


@pytest.mark.parametrize(
    ("overcommit", "device_used", "warns"),
    [(1.0, 79 * GiB, False), (1.25, 71 * GiB, False), (1.25, 72 * GiB, True), (2.0, 80 * GiB, True)],
)
def test_overcommit_watermark(overcommit: float, device_used: int, warns: bool) -> None:
    verdict = assess(kernel(GiB), DeviceUsage("GPU0", 80 * GiB, device_used, None), [], overcommit)
    assert any("overcommitted" in warning for warning in verdict.warnings) is warns


def test_attribution_sums_a_kernels_process_tree_only() -> None:
    by_pid = {
        10: ProcessUsage(GiB, 20),
        11: ProcessUsage(2 * GiB, 30),  # a child of kernel a
        20: ProcessUsage(3 * GiB, None),
        99: ProcessUsage(5 * GiB, 50),  # a pid from another namespace: nobody's
    }
    trees = {"a": frozenset({10, 11, 12}), "b": frozenset({20}), "c": frozenset({30})}
    result = attribute(by_pid, trees)
    assert result == {"a": ProcessUsage(3 * GiB, 50), "b": ProcessUsage(3 * GiB, None)}
