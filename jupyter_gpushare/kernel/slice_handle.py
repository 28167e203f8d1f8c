"""This kernel's handle on its own slice, chosen once: what ``%gpu`` and the Python API call.

Each backend kind names its kernels' handle (``BackendKind.slice_handle``); the two here are named
for where they reach the slice. A kernel started by a local provisioner acts on its slice through
its node's slices — the node ledger, or the GPU broker that holds it
(:class:`~.node_handle.NodeSliceHandle`, the default); a kernel in a pod asks the server that
started the pod over HTTP (:class:`~.pod_handle.PodSliceHandle`). Both prove who they are with the
kernel's own token, answer the same calls and print the same views; the magics never ask which
one they have.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from jupyter_gpushare.config import kinds
from jupyter_gpushare.core import env_names

if TYPE_CHECKING:
    from jupyter_gpushare.kernel.display import PoolStatus, TextView

WaitCallback = Callable[[int, str], None]


class SliceHandle(Protocol):
    """A kernel's handle on its own slice: what ``%gpu`` and the Python API call."""

    kernel_id: str

    def status(self, notes: list[str] | None = None) -> TextView:
        """The slice, its measured use, caps and warnings (plus ``notes``)."""

    def pool(self) -> PoolStatus:
        """Every device with reserved and used memory; other users' slices anonymous."""

    def request(
        self, memory: object, mode: object = None, cores: object = None, on_wait: WaitCallback | None = None
    ) -> TextView:
        """Take a slice (waiting in the queue like a start); refused where a slice is fixed."""

    def resize(self, memory: object, restart: bool = False, force: bool = False) -> TextView:
        """Grow or shrink the slice; where that needs a restart, only with ``restart``; below what
        the kernel holds, only with ``force`` (the held memory then stays reserved)."""

    def release(self) -> TextView:
        """Give the slice back while the kernel runs on; refused where a slice is fixed."""

    def suspend(self) -> TextView:
        """Move the GPU state to host memory and give the slice back for real."""

    def resume(self, on_wait: WaitCallback | None = None) -> TextView:
        """Wait for a slice like a start and restore the GPU state."""

    def declare_usage(self, memory: object, utilization: int | None = None) -> None:
        """Declare this kernel's use (simulated pools, demos and tests; labelled simulated)."""

    def watch(self, **kwargs: Any) -> Any:
        """A live ipywidgets view of the slice."""

    def start(self, shell: Any) -> None:
        """What this handle does in the background once the extension is loaded."""


_chosen: SliceHandle | None = None


def slice_handle() -> SliceHandle:
    """This kernel's slice handle, chosen on first use: the one its backend kind names
    (``BackendKind.slice_handle``), the kind being the one its provisioner wrote into its
    environment (``$JUPYTER_GPUSHARE_BACKEND``; a kernel no provisioner started has the default).
    Light to build: nothing is opened before it is needed."""
    global _chosen
    if _chosen is None:
        from jupyter_gpushare.backends.registry import kind_named, load

        name = os.environ.get(env_names.BACKEND) or kinds.DEFAULT_KIND
        _chosen = load(kind_named(name).slice_handle)()
    return _chosen
