"""The ``local`` kind as the registry knows it (entry point ``jupyter_gpushare.backends``).

Light to import: a kernel looks its kind up before its first cell, so the backend, the
provisioner and the ledger are imported only when one of them is first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpushare.backends.registry import BackendKind

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.backend import LocalBackend
    from jupyter_gpushare.backends.local.cell_notes import LedgerNotes
    from jupyter_gpushare.backends.local.provisioner import LocalGPUShareProvisioner
    from jupyter_gpushare.config import GPUShare


def _backend(settings: GPUShare) -> LocalBackend:
    from jupyter_gpushare.backends.local.per_process import local_backend

    return local_backend(settings)


def _provisioner(settings: GPUShare) -> type[LocalGPUShareProvisioner]:
    # A kernel process takes its slice from the ledger or from the broker alike.
    from jupyter_gpushare.backends.local.provisioner import LocalGPUShareProvisioner

    return LocalGPUShareProvisioner


def _cell_notes(settings: GPUShare) -> LedgerNotes | None:
    from jupyter_gpushare.backends.local.cell_notes import ledger_notes

    return ledger_notes(settings)


KIND = BackendKind(
    name="local",
    make_backend=_backend,
    provisioner=_provisioner,
    broker_side="jupyter_gpushare.backends.local.broker.side:SIDE",
    doctor_checks="jupyter_gpushare.backends.local.doctor:local_checks",
    # Kernels act on their slices through the backend (the default slice_handle); around each
    # cell through the ledger file alone, so that a kernel probes no device before %gpu.
    cell_notes=_cell_notes,
)

__all__ = ["KIND"]
