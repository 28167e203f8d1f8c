"""The ``kubernetes`` kind as the registry knows it (entry point ``jupyter_gpushare.backends``)."""

from __future__ import annotations

from ...config import GPUShare
from ..registry import BackendKind
from .backend import kubernetes_backend
from .provisioner import KubernetesProvisioner
from .via_broker import RemotePodProvisioner


def _provisioner(settings: GPUShare) -> type[KubernetesProvisioner]:
    # With a broker the server holds no cluster credentials: the broker creates the pods.
    return RemotePodProvisioner if settings.effective_broker_url() else KubernetesProvisioner


KIND = BackendKind(
    name="kubernetes",
    make_backend=kubernetes_backend,
    provisioner=_provisioner,
    broker_side="jupyter_gpushare.broker.kubernetes_side:SIDE",
    doctor_checks="jupyter_gpushare.doctor.cluster:cluster_checks",
)

__all__ = ["KIND"]
