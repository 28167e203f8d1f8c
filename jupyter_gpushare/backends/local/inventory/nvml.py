"""Real GPUs through NVML (``nvidia-ml-py``), the only module that talks to the driver."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from jupyter_gpushare.core.devices import Device, Inventory, MigInstance

_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)


def _nvml() -> Any:
    """Import pynvml lazily so a machine without it still imports the package."""
    import pynvml

    return pynvml


def read_nvml_inventory() -> Inventory:
    """Devices as NVML reports them, or an empty inventory naming what is missing.

    Never raises for a missing driver: "no GPU here" is a state the server shows, not a crash.
    """
    try:
        nvml = _nvml()
    except ImportError:
        return _none("the nvidia-ml-py package is not installed (pip install nvidia-ml-py)")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return _none(
            f"NVML could not start ({error}); install the NVIDIA driver, or set "
            "c.GPUShare.simulate / JUPYTER_GPUSHARE_SIMULATE for a simulated pool"
        )
    try:
        count = nvml.nvmlDeviceGetCount()
        devices = tuple(_read_device(nvml, index) for index in range(count))
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as error:
        return _none(f"NVML failed while listing devices: {error}")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if not devices:
        return _none("the NVIDIA driver is loaded but reports no GPU")
    return Inventory(devices=devices, source="nvml", details={"driver": driver})


def _read_device(nvml: Any, index: int) -> Device:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory_total, memory_used = usable_memory(nvml, handle)
    try:
        utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:  # not supported on MIG-enabled or some older boards
        utilization = None
    return Device(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total=memory_total,
        memory_used=memory_used,
        utilization=utilization,
        mig=_read_mig(nvml, handle),
    )


def usable_memory(nvml: Any, handle: Any) -> tuple[int, int]:
    """(total, used) of what processes can allocate. NVML's first memory call counts what the
    driver and firmware reserve in both (615 MiB of an H200's 143,771 MiB: offering it to
    kernels over-commits the card); the second version reports it apart. Older drivers and
    bindings without it give the first."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(memory.total) - int(memory.reserved), int(memory.used)
        except (nvml.NVMLError, TypeError, AttributeError):
            pass  # a driver or binding without version 2: the first version's figures
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(memory.total), int(memory.used)


def _read_mig(nvml: Any, handle: Any) -> tuple[MigInstance, ...]:
    try:
        current_mode, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # boards without MIG answer NotSupported
        return ()
    if current_mode != nvml.NVML_DEVICE_MIG_ENABLE:
        return ()
    instances: list[MigInstance] = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:  # empty slot
            continue
        name = _text(nvml.nvmlDeviceGetName(mig_handle))
        profile = _MIG_PROFILE.search(name)
        instances.append(
            MigInstance(
                uuid=_text(nvml.nvmlDeviceGetUUID(mig_handle)),
                profile=profile.group(1).lower() if profile else name,
                memory_total=int(nvml.nvmlDeviceGetMemoryInfo(mig_handle).total),
            )
        )
    return tuple(instances)


def _text(value: str | bytes) -> str:
    # Older bindings return bytes; nvidia-ml-py 12+ returns str.
    return value.decode() if isinstance(value, bytes) else value


def _none(problem: str) -> Inventory:
    return Inventory(devices=(), source="none", problem=f"no GPU found: {problem}")
