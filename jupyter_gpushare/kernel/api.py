"""The Python API behind the magics: ``from jupyter_gpushare import kernel; kernel.status()``.

Each call goes to this kernel's slice handle (:func:`~.slice_handle.slice_handle`), whichever kind it is.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.kernel.display import PoolStatus, TextView
from jupyter_gpushare.kernel.slice_handle import slice_handle


def status(notes: list[str] | None = None) -> TextView:
    """The slice this kernel holds, its measured use and any warnings."""
    return slice_handle().status(notes)


def pool() -> PoolStatus:
    """All devices with reserved and used memory; other users' slices are anonymous."""
    return slice_handle().pool()


def request(memory: object, mode: object = None, cores: object = None) -> TextView:
    """Take a slice for this kernel (waits in the queue when the pool is full)."""

    return slice_handle().request(memory, mode, cores, on_wait=_tell)


def _tell(position: int, reason: str) -> None:
    print(f"Waiting for a GPU slice: position {position} in the queue ({reason})", flush=True)


def resize(memory: object, restart: bool = False, force: bool = False) -> TextView:
    """Resize this kernel's slice; JAX/TensorFlow (and kernel pods) need ``restart=True``; a
    shrink below what the kernel holds needs ``force=True`` (that memory then stays reserved)."""
    return slice_handle().resize(memory, restart, force)


def release() -> TextView:
    """Give the slice back; the kernel keeps running without a GPU reservation (what its
    processes still hold stays reserved until it is freed)."""
    return slice_handle().release()


def suspend() -> TextView:
    """Move this kernel's GPU state to host memory and give its slice back (in a cell: when the
    cell ends); the next cell, or :func:`resume`, brings it back."""
    return slice_handle().suspend()


def resume() -> TextView:
    """Wait for a slice like a start (any GPU of the same chip) and restore the GPU state."""
    return slice_handle().resume(on_wait=_tell)


def simulate_usage(memory: object, utilization: int | None = None) -> None:
    """Declare this kernel's GPU use on a simulated pool (labelled simulated everywhere)."""
    slice_handle().declare_usage(memory, utilization)


def watch(**kwargs: Any) -> Any:
    """A live ipywidgets view of this kernel's slice (see ``%gpu watch``)."""
    return slice_handle().watch(**kwargs)
