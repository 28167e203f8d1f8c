"""The ``kubernetes`` kind as the registry knows it (entry point ``jupyter_gpushare.backends``).

Light to import: a kernel pod looks its kind up before its first cell, so the backend and the
provisioners (and with them the cluster's client) are imported only when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpushare.backends.registry import BackendKind

if TYPE_CHECKING:
    from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
    from jupyter_gpushare.backends.kubernetes.provisioner import KubernetesProvisioner
    from jupyter_gpushare.config import GPUShare


def _backend(settings: GPUShare) -> KubernetesBackend:
    from jupyter_gpushare.backends.kubernetes.backend import kubernetes_backend

    return kubernetes_backend(settings)


def _provisioner(settings: GPUShare) -> type[KubernetesProvisioner]:
    # One provisioner: who makes its pods (the server, or a broker with c.GPUShare.broker_url) is
    # its keeper, chosen from the same settings at the start (provisioner.open_keeper).
    from jupyter_gpushare.backends.kubernetes.provisioner import KubernetesProvisioner

    return KubernetesProvisioner


KIND = BackendKind(
    name="kubernetes",
    make_backend=_backend,
    provisioner=_provisioner,
    broker_side="jupyter_gpushare.backends.kubernetes.broker.side:SIDE",
    doctor_checks="jupyter_gpushare.backends.kubernetes.doctor:cluster_checks",
    # A kernel pod has no ledger: it asks the server that started it over HTTP.
    slice_handle="jupyter_gpushare.kernel.pod_handle:PodSliceHandle",
)

__all__ = ["KIND"]
