"""Reading live usage from NVML: per device, and per process (the I/O half of sampling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.local.inventory import (
    nvml as nvml_module,  # one seam: tests substitute _nvml there
)
from jupyter_gpushare.backends.local.usage.attribution import ProcessUsage


@dataclass(frozen=True)
class NVMLSnapshot:
    devices: dict[str, tuple[int, int | None]]  # uuid -> (memory used, utilization)
    processes: dict[int, ProcessUsage]  # pid as NVML reports it -> usage


def read_snapshot(device_uuids: Sequence[str], since: int = 0) -> NVMLSnapshot:
    """Usage now; process utilisation averaged over samples newer than ``since`` (µs)."""
    nvml = nvml_module._nvml()
    nvml.nvmlInit()
    try:
        devices: dict[str, tuple[int, int | None]] = {}
        processes: dict[int, ProcessUsage] = {}
        for uuid in device_uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            _, memory_used = nvml_module.usable_memory(nvml, handle)  # the driver's reserve apart
            devices[uuid] = (memory_used, _device_utilization(nvml, handle))
            utilization = _process_utilization(nvml, handle, since)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = process.usedGpuMemory or 0  # None where the driver hides it
                previous = processes.get(process.pid)
                processes[process.pid] = ProcessUsage(
                    memory=used + (previous.memory if previous else 0),
                    # A process on several devices: its known shares add up, capped at 100%.
                    utilization=_add_percent(
                        previous.utilization if previous else None, utilization.get(process.pid)
                    ),
                )
        return NVMLSnapshot(devices, processes)
    finally:
        nvml.nvmlShutdown()


def _device_utilization(nvml: Any, handle: Any) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        return None


def _process_utilization(nvml: Any, handle: Any, since: int) -> dict[int, int]:
    """Mean SM share per pid over NVML's samples newer than ``since`` (0: its whole buffer)."""
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
    except nvml.NVMLError:  # not supported, or no samples in the window
        return {}
    totals: dict[int, list[int]] = {}
    for sample in samples:
        totals.setdefault(int(sample.pid), []).append(int(sample.smUtil))
    return {pid: round(sum(values) / len(values)) for pid, values in totals.items()}


def _add_percent(first: int | None, second: int | None) -> int | None:
    if first is None:
        return second
    if second is None:
        return first
    return min(100, first + second)
