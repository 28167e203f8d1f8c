"""Reading live usage from NVML: per device, and per process (the I/O half of sampling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..inventory.nvml import _nvml
from .attribution import ProcessUsage


@dataclass(frozen=True)
class NVMLSnapshot:
    devices: dict[str, tuple[int, int | None]]  # uuid -> (memory used, utilization)
    processes: dict[int, ProcessUsage]  # pid as NVML reports it -> usage


def read_snapshot(device_uuids: Sequence[str]) -> NVMLSnapshot:
    nvml = _nvml()
    nvml.nvmlInit()
    try:
        devices: dict[str, tuple[int, int | None]] = {}
        processes: dict[int, ProcessUsage] = {}
        for uuid in device_uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices[uuid] = (int(memory.used), _device_utilization(nvml, handle))
            utilization = _process_utilization(nvml, handle)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = process.usedGpuMemory or 0  # None where the driver hides it
                previous = processes.get(process.pid)
                processes[process.pid] = ProcessUsage(
                    memory=used + (previous.memory if previous else 0),
                    utilization=utilization.get(process.pid),
                )
        return NVMLSnapshot(devices, processes)
    finally:
        nvml.nvmlShutdown()


def _device_utilization(nvml: Any, handle: Any) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        return None


def _process_utilization(nvml: Any, handle: Any) -> dict[int, int]:
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    except nvml.NVMLError:  # not supported, or no samples yet
        return {}
    return {int(sample.pid): int(sample.smUtil) for sample in samples}
