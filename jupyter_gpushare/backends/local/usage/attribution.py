"""Mapping GPU processes to kernels through their process trees. Pure.

NVML reports the pids it sees, which inside a container may be host pids that mean nothing
here. Only pids found in a kernel's own process tree are counted; a kernel with GPU use NVML
cannot place is left to its own report rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessUsage:
    memory: int  # bytes
    utilization: int | None  # SM %, where NVML reports it


def attribute(
    by_pid: Mapping[int, ProcessUsage], trees: Mapping[str, frozenset[int]]
) -> dict[str, ProcessUsage]:
    """Sum the usage of each kernel's processes; kernels with no GPU process are absent."""
    result: dict[str, ProcessUsage] = {}
    for kernel_id, pids in trees.items():
        mine = [by_pid[pid] for pid in pids if pid in by_pid]
        if not mine:
            continue
        utilizations = [usage.utilization for usage in mine if usage.utilization is not None]
        result[kernel_id] = ProcessUsage(
            memory=sum(usage.memory for usage in mine),
            utilization=min(100, sum(utilizations)) if utilizations else None,
        )
    return result
