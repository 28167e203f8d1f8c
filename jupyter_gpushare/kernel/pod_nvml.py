"""What a kernel pod that holds whole cards reads of them through NVML, inside its container.

NVIDIA's container toolkit gives a container the driver's ``libnvidia-ml.so.1`` and only the
devices ``NVIDIA_VISIBLE_DEVICES`` names, so NVML in there lists exactly the pod's cards. A pod
holding them whole may take their device-level memory used as its own: it counts the CUDA
context and every library's allocations, which PyTorch's figure misses. Per-process figures are
out of reach in a container (NVML reports processes by the host's PIDs: the driver knows no PID
namespaces), so a pod on a shared card cannot tell its use from its neighbours': it reads nothing
here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

log = logging.getLogger("jupyter_gpushare")


class WholeCards:
    """The container's cards through ``pynvml``: NVML started on the first read and kept; the
    first failure is kept in :attr:`problem` and ends the reading (the kernel never sees it)."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self._nvml: Any = None
        self._lock = threading.Lock()  # the reporter thread and a cell's declaration both read

    def read(self) -> tuple[int, int | None] | None:
        """``(bytes used, utilization)`` of every card NVML shows (the utilisation their mean,
        where the boards report one), or None once NVML has failed here."""
        with self._lock:
            if self.problem is not None:
                return None
            try:
                return self._read()
            except Exception as error:  # no library, no driver, a card lost: the kernel goes on
                self.problem = f"NVML cannot be read in this pod: {error or type(error).__name__}"
                log.info(
                    "jupyter_gpushare: %s; the GPU use reported is PyTorch's, where it has some", self.problem
                )
                if self._nvml is not None:
                    with contextlib.suppress(Exception):
                        self._nvml.nvmlShutdown()
                    self._nvml = None
                return None

    def _read(self) -> tuple[int, int | None]:
        if self._nvml is None:
            import pynvml  # lazily: most kernels never read NVML

            pynvml.nvmlInit()
            self._nvml = pynvml
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise LookupError("it shows no GPU in this container")
        used, utilizations = 0, []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            used += _memory_used(nvml, handle)
            with contextlib.suppress(nvml.NVMLError):  # a board that does not report it
                utilizations.append(int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        return used, round(sum(utilizations) / len(utilizations)) if utilizations else None


def _memory_used(nvml: Any, handle: Any) -> int:
    """What processes use, without the driver's reserve where NVML reports it apart (its second
    memory call), as the local backend's inventory reads it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle, version=version).used)
        except (nvml.NVMLError, TypeError, AttributeError):
            pass  # a driver or binding without version 2: the first version's figure
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
