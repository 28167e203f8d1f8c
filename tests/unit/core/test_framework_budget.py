"""The slice less its CUDA context: what framework caps give their allocators."""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.framework_budget import CUDA_CONTEXT_ALLOWANCE, framework_budget
from jupyter_gpushare.core.sizes import GiB, MiB


def test_the_allowance_covers_the_context_measured_on_an_h200() -> None:
    # 518 MiB: PyTorch 2.11's context on an H200 (driver 580) with nothing allocated.
    assert 518 * MiB < CUDA_CONTEXT_ALLOWANCE


@pytest.mark.parametrize(
    ("slice_memory", "budget"),
    [
        (10 * GiB, 10 * GiB - 768 * MiB),
        (4 * GiB, 4 * GiB - 768 * MiB),
        (3 * GiB, 3 * GiB - 768 * MiB),  # a quarter is exactly the allowance
        (2 * GiB, 1536 * MiB),  # a quarter at most: small slices stay usable
        (512 * MiB, 384 * MiB),
        (0, 0),
    ],
)
def test_a_framework_gets_the_slice_less_the_context(slice_memory: int, budget: int) -> None:
    assert framework_budget(slice_memory) == budget
