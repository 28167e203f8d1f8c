"""Kernel provisioners registered under ``jupyter_client.kernel_provisioners``.

``gpushare-provisioner`` is :class:`GPUShareProvisioner`; constructing it builds the provisioner
of the configured backend (``c.GPUShare.backend``): local processes or Kubernetes pods — pods the
server creates itself, or pods the GPU broker creates for it (``c.GPUShare.broker_url``). Local
kernels take their slice from the ledger or from the broker alike (:mod:`.local`).
"""

from __future__ import annotations

from typing import Any

from ..config import load_settings
from .base import GPUShareProvisioner


def backend_class(parent: Any) -> type[GPUShareProvisioner]:
    """The provisioner class of the configured backend (the one place that picks it)."""
    settings = load_settings(getattr(parent, "config", None), reconcile=False)
    if settings.backend == "kubernetes" and settings.effective_broker_url():
        from .remote_pod import RemotePodProvisioner

        return RemotePodProvisioner
    if settings.backend == "kubernetes":
        from .kubernetes import KubernetesProvisioner

        return KubernetesProvisioner
    from .local import LocalGPUShareProvisioner

    return LocalGPUShareProvisioner


__all__ = ["GPUShareProvisioner", "backend_class"]
