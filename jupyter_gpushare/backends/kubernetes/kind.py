"""The ``kubernetes`` kind as the registry knows it (entry point ``jupyter_gpushare.backends``)."""

from __future__ import annotations

from ...config import GPUShare
from ..registry import BackendKind
from .backend import kubernetes_backend
from .provisioner import KubernetesProvisioner


def _provisioner(settings: GPUShare) -> type[KubernetesProvisioner]:
    # One provisioner: who makes its pods (the server, or a broker with c.GPUShare.broker_url) is
    # its keeper, chosen from the same settings at the start (provisioner.open_keeper).
    return KubernetesProvisioner


KIND = BackendKind(
    name="kubernetes",
    make_backend=kubernetes_backend,
    provisioner=_provisioner,
    broker_side="jupyter_gpushare.backends.kubernetes.broker.side:SIDE",
    doctor_checks="jupyter_gpushare.backends.kubernetes.doctor:cluster_checks",
)

__all__ = ["KIND"]
