"""The Python API behind the magics: ``from jupyter_gpushare import kernel; kernel.status()``."""

from __future__ import annotations

from typing import Any

from . import caps
from .display import PoolStatus, SliceStatus
from .own_slice import OwnSlice

_own: OwnSlice | None = None


def own_slice() -> OwnSlice:
    """This kernel's slice handle (created on first use)."""
    global _own
    if _own is None:
        _own = OwnSlice()
    return _own


def status(notes: list[str] | None = None) -> SliceStatus:
    """The slice this kernel holds, its measured use and any warnings."""
    handle = own_slice()
    record = handle.record()
    return SliceStatus(
        kernel_id=handle.kernel_id,
        record=record,
        device=handle.device_label(record) if record else "",
        free_on_device=handle.free_on_device(record) if record else None,
        simulated=handle.service.inventory.simulated or handle.service.ledger.simulated(),
        caps=[f"{result.framework}: {result.detail}" for result in caps.results().values()],
        notes=list(notes or []),
    )


def pool() -> PoolStatus:
    """All devices with reserved and used memory; other users' slices are anonymous."""
    return PoolStatus(own_slice().service.pool())


def request(memory: object, mode: object = None, cores: object = None) -> SliceStatus:
    """Take a slice for this kernel (waits in the queue when the pool is full)."""

    def tell(position: int, reason: str) -> None:
        print(f"Waiting for a GPU slice: position {position} in the queue ({reason})", flush=True)

    own_slice().request(memory, mode, cores, on_wait=tell)
    return status(["New slice taken. Frameworks that already use the GPU keep their device until restart."])


def resize(memory: object, restart: bool = False) -> SliceStatus:
    """Resize this kernel's slice in place; JAX/TensorFlow need ``restart=True``."""
    _, notes = own_slice().resize(memory, restart=restart)
    return status(notes)


def release() -> SliceStatus:
    """Give the slice back; the kernel keeps running without a GPU reservation."""
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
    own_slice().report_usage(memory, utilization)


def watch(**kwargs: Any) -> Any:
    """A live ipywidgets view of this kernel's slice (see ``%gpu watch``)."""
    from .widgets import SliceWatch

    return SliceWatch(own_slice(), **kwargs)
