"""Where slices come from: one backend object per process and settings, chosen here once.

``c.GPUShare.backend`` picks its kind in the registry (:mod:`.registry`): ``local`` (the node
ledger, :mod:`.local`), ``kubernetes`` (kernel pods, :mod:`.kubernetes`) or one another package
registers — unless ``c.GPUShare.broker_url`` names a GPU broker, which
then holds the ledger or the cluster for every user (:mod:`.broker_client` is its client). Everything
above — the server extension, the CLI, the metrics, the provisioners, ``%gpu`` — holds a
:class:`~.protocol.Backend` and never asks which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from jupyter_gpushare.core.errors import ConfigurationError

if TYPE_CHECKING:
    from jupyter_gpushare.backends.protocol import Backend, CellNotes, NodeSlices, ServerHooks, ServerKernels
    from jupyter_gpushare.config import GPUShare

_FROM_BASE = ("Backend", "CellNotes", "NodeSlices", "ServerHooks", "ServerKernels")


def __getattr__(name: str) -> Any:
    # The protocols are imported on first use: a kernel looking up its kind (the registry, in
    # this package) before its first cell loads only what it needs.
    if name in _FROM_BASE:
        from jupyter_gpushare.backends import protocol as base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_for(settings: GPUShare) -> Backend:
    """This process's backend for ``settings`` (built once; NVML probed or cluster reached once):
    the GPU broker's client where ``c.GPUShare.broker_url`` names one, else the configured kind's."""
    # Imported here: a kernel importing this package for its types loads neither.
    from jupyter_gpushare.backends.broker_client.backend import remote_backend
    from jupyter_gpushare.backends.registry import kind_for

    if settings.effective_broker_url():
        return remote_backend(settings)
    return kind_for(settings).make_backend(settings)


def kernel_slices_for(settings: GPUShare) -> NodeSlices:
    """Where a kernel acting on its own slice reaches it (``%gpu`` in a local kernel): the GPU
    broker, else its kind's backend, which then holds kernels' slices (a ``NodeSlices``)."""
    backend = backend_for(settings)
    if not callable(getattr(backend, "own_slice", None)):
        raise ConfigurationError(
            f"the {backend.name} backend does not hold a kernel's own slice: its kind must name "
            "a kernel handle of its own (BackendKind.kernel_slice)"
        )
    return cast("NodeSlices", backend)


def cell_notes_for(settings: GPUShare) -> CellNotes | None:
    """Where a kernel notes its cells and reads its warnings around every cell, as cheaply as its
    kind allows: the GPU broker, else the kind's ``cell_notes`` (no devices probed), else the
    backend itself. None: the kernel has nothing to note."""
    from jupyter_gpushare.backends.broker_client.backend import remote_backend
    from jupyter_gpushare.backends.registry import kind_for

    if settings.effective_broker_url():
        return remote_backend(settings)
    kind = kind_for(settings)
    if kind.cell_notes is not None:
        return kind.cell_notes(settings)
    return kernel_slices_for(settings)


__all__ = [
    "Backend",
    "CellNotes",
    "NodeSlices",
    "ServerHooks",
    "ServerKernels",
    "backend_for",
    "cell_notes_for",
    "kernel_slices_for",
]
