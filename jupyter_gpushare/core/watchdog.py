"""What a kernel should be told about its usage, and whether it is over its slice. Pure.

* above 90% of its slice: a warning;
* above 100%: a warning, and in soft modes the configured ``over_limit_action``;
* on a saturated device (SM utilisation >= 90%): its own share and its neighbours';
* with overcommit > 1 and the device's real memory nearly full: a watermark warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jupyter_gpushare.core.sizes import format_bytes

WARN_FRACTION = 0.9
SATURATED_PERCENT = 90
WATERMARK_FRACTION = 0.9


@dataclass(frozen=True)
class KernelUsage:
    kernel_id: str
    memory: int  # the slice, bytes
    memory_used: int | None
    utilization: int | None


@dataclass(frozen=True)
class DeviceUsage:
    label: str  # "GPU0"
    memory_total: int
    memory_used: int | None
    utilization: int | None


@dataclass(frozen=True)
class Verdict:
    warnings: tuple[str, ...]
    over_limit: bool


def assess(
    kernel: KernelUsage,
    device: DeviceUsage,
    neighbours: Sequence[KernelUsage],
    overcommit: float,
) -> Verdict:
    """The warnings for ``kernel`` on ``device`` shared with ``neighbours``."""
    warnings: list[str] = []
    over_limit = False
    used = kernel.memory_used
    if used is not None and kernel.memory > 0:
        share = used / kernel.memory
        if share > 1.0:
            over_limit = True
            warnings.append(
                f"above its slice: using {format_bytes(used)} of {format_bytes(kernel.memory)} "
                f"({100 * share:.0f}%)"
            )
        elif share >= WARN_FRACTION:
            warnings.append(
                f"near its slice: using {format_bytes(used)} of {format_bytes(kernel.memory)} "
                f"({100 * share:.0f}%)"
            )
    if device.utilization is not None and device.utilization >= SATURATED_PERCENT:
        own = "unknown" if kernel.utilization is None else f"{kernel.utilization}%"
        others = sum(neighbour.utilization or 0 for neighbour in neighbours)
        count = len(neighbours)
        warnings.append(
            f"{device.label} is saturated ({device.utilization}% busy): this kernel {own}, "
            f"{count} other kernel{'s' if count != 1 else ''} {others}%"
        )
    if (
        overcommit > 1.0
        and device.memory_used is not None
        and device.memory_used >= WATERMARK_FRACTION * device.memory_total
    ):
        warnings.append(
            f"{device.label} memory is {100 * device.memory_used / device.memory_total:.0f}% used "
            f"while reservations are overcommitted ({overcommit:g}x): allocations may fail before "
            "this slice is full"
        )
    return Verdict(tuple(warnings), over_limit)
