"""The Python API behind the magics: ``from jupyter_gpushare import kernel; kernel.status()``."""

from __future__ import annotations

from typing import Any

from ..errors import GPUShareError
from . import caps, pod
from .display import PodSliceStatus, PoolStatus, SliceStatus
from .own_slice import OwnSlice

IN_POD_FIXED = (
    "a kernel pod gets its GPU slice when the pod starts and keeps it for the pod's life: "
    "use %gpu resize SIZE --restart for another size, or shut the kernel down to free it"
)

_own: OwnSlice | None = None


def own_slice() -> OwnSlice:
    """This kernel's slice handle (created on first use)."""
    global _own
    if _own is None:
        _own = OwnSlice()
    return _own


def _caps() -> list[str]:
    return [f"{result.framework}: {result.detail}" for result in caps.results().values()]


def _pod_status(kernel: pod.PodKernel, notes: list[str] | None) -> PodSliceStatus:
    try:
        view, problem = kernel.view().get("kernel"), None
    except GPUShareError as error:
        view, problem = None, str(error)
    return PodSliceStatus(kernel.mode, kernel.memory, view, problem, _caps(), list(notes or []))


def status(notes: list[str] | None = None) -> SliceStatus | PodSliceStatus:
    """The slice this kernel holds, its measured use and any warnings."""
    kernel = pod.current()
    if kernel is not None:
        return _pod_status(kernel, notes)
    handle = own_slice()
    record = handle.record()
    return SliceStatus(
        kernel_id=handle.kernel_id,
        record=record,
        device=handle.device_label(record) if record else "",
        free_on_device=handle.free_on_device(record) if record else None,
        simulated=handle.service.inventory.simulated or handle.service.ledger.simulated(),
        caps=_caps(),
        notes=list(notes or []),
    )


def pool() -> PoolStatus:
    """All devices with reserved and used memory; other users' slices are anonymous."""
    kernel = pod.current()
    if kernel is not None:
        return PoolStatus(kernel.view()["pool"])
    return PoolStatus(own_slice().service.pool())


def request(memory: object, mode: object = None, cores: object = None) -> SliceStatus | PodSliceStatus:
    """Take a slice for this kernel (waits in the queue when the pool is full)."""
    if pod.current() is not None:
        raise GPUShareError(IN_POD_FIXED)

    def tell(position: int, reason: str) -> None:
        print(f"Waiting for a GPU slice: position {position} in the queue ({reason})", flush=True)

    own_slice().request(memory, mode, cores, on_wait=tell)
    return status(["New slice taken. Frameworks that already use the GPU keep their device until restart."])


def resize(memory: object, restart: bool = False) -> SliceStatus | PodSliceStatus:
    """Resize this kernel's slice in place; JAX/TensorFlow (and kernel pods) need ``restart=True``."""
    kernel = pod.current()
    if kernel is not None:
        message = kernel.resize(memory, restart)
        return PodSliceStatus(kernel.mode, kernel.memory, None, None, _caps(), [message])
    _, notes = own_slice().resize(memory, restart=restart)
    return status(notes)


def release() -> SliceStatus | PodSliceStatus:
    """Give the slice back; the kernel keeps running without a GPU reservation."""
    if pod.current() is not None:
        raise GPUShareError(IN_POD_FIXED)
    released = own_slice().release()
    from ..sizes import format_bytes

    return status(
        [
            f"Released {format_bytes(released.memory)}. Memory a framework already holds stays in use "
            "until you free it (e.g. torch.cuda.empty_cache()) or restart the kernel."
        ]
    )


def simulate_usage(memory: object, utilization: int | None = None) -> None:
    """Declare this kernel's GPU use on a simulated pool (labelled simulated everywhere)."""
    kernel = pod.current()
    if kernel is not None:
        kernel.declare(memory, utilization)
        return
    own_slice().report_usage(memory, utilization)


def watch(**kwargs: Any) -> Any:
    """A live ipywidgets view of this kernel's slice (see ``%gpu watch``)."""
    if pod.current() is not None:
        raise GPUShareError(
            "%gpu watch reads the node ledger, which a kernel pod does not have; the JupyterLab GPU "
            "panel shows this kernel live, and %gpu status shows its latest use"
        )
    from .widgets import SliceWatch

    return SliceWatch(own_slice(), **kwargs)
