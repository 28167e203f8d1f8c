"""Where slices come from: one backend object per process and settings, chosen here once.

``c.GPUShare.backend`` picks its kind in the registry (:mod:`.registry`): ``local`` (the node
ledger, :mod:`.local`), ``kubernetes`` (kernel pods, :mod:`.kubernetes`) or one another package
registers — unless ``c.GPUShare.broker_url`` names a GPU broker, which
then holds the ledger or the cluster for every user (:mod:`.broker_client` is its client). Everything
above holds the role of it that it uses (:mod:`.protocol`) and never asks which backend it has:
the server extension, the CLI and the broker's routes a :class:`~.protocol.Backend`
(:func:`backend_for`); a local kernel's provisioner and the kernel's ``%gpu`` also its
:class:`~.protocol.NodeSlices` (:func:`node_slices_for`); a kernel around each cell its
:class:`~.protocol.CellNotes` (:func:`cell_notes_for`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyter_gpushare.core.errors import ConfigurationError

if TYPE_CHECKING:
    from jupyter_gpushare.backends.protocol import (
        Accounting,
        Backend,
        CellNotes,
        Kernels,
        NodeSlices,
        Pool,
        ServerHooks,
        ServerKernels,
    )
    from jupyter_gpushare.config import GPUShare

_FROM_BASE = (
    "Accounting",
    "Backend",
    "CellNotes",
    "Kernels",
    "NodeSlices",
    "Pool",
    "ServerHooks",
    "ServerKernels",
)


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


def node_slices_for(settings: GPUShare) -> NodeSlices:
    """Where a local kernel's provisioner and the kernel itself (``%gpu``) take and change its
    slice: the GPU broker, else the kind's backend where it holds kernels' slices."""
    from jupyter_gpushare.backends.protocol import NodeSlices

    backend = backend_for(settings)
    if not isinstance(backend, NodeSlices):
        raise ConfigurationError(
            f"the {backend.name} backend does not hold a kernel's own slice: its kind must name "
            "a kernel handle of its own (BackendKind.slice_handle)"
        )
    return backend


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
    return node_slices_for(settings)


__all__ = [
    "Accounting",
    "Backend",
    "CellNotes",
    "Kernels",
    "NodeSlices",
    "Pool",
    "ServerHooks",
    "ServerKernels",
    "backend_for",
    "cell_notes_for",
    "node_slices_for",
]
