"""The ``local`` kind as the registry knows it (entry point ``jupyter_gpushare.backends``)."""

from __future__ import annotations

from ...config import GPUShare
from ..registry import BackendKind
from .per_process import local_backend
from .provisioner import LocalGPUShareProvisioner


def _provisioner(settings: GPUShare) -> type[LocalGPUShareProvisioner]:
    # A kernel process takes its slice from the ledger or from the broker alike.
    return LocalGPUShareProvisioner


KIND = BackendKind(
    name="local",
    make_backend=local_backend,
    provisioner=_provisioner,
    broker_side="jupyter_gpushare.backends.local.broker.side:SIDE",
    doctor_checks="jupyter_gpushare.backends.local.doctor:local_checks",
)

__all__ = ["KIND"]
