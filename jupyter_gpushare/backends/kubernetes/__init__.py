"""The Kubernetes backend's room: a pod per kernel on a cluster.

:mod:`.backend` (the cluster as a :class:`~jupyter_gpushare.backends.protocol.Backend`),
:mod:`.provisioner` (a kernel in a pod) and its :mod:`.pod_keeper`, who makes the pods: the
server itself (:mod:`.cluster_pods`; :mod:`.pod_start` follows a start, :mod:`.kernel_objects`
creates and deletes a pod's Secret and claim, as the broker's pods do) or the GPU broker
(:mod:`.pods_from_broker`). The pure builders of a kernel's objects are :mod:`.objects`; the
cluster's I/O (the API client, one list+watch, the calls) is :mod:`.cluster`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpushare.backends.kubernetes.backend import (
        POD_HOLDERS,
        KubernetesBackend,
        kubernetes_backend,
    )


def __getattr__(name: str) -> Any:
    # Imported on first use: a kernel pod looking its kind up (:mod:`.kind`) loads no cluster client.
    if name in __all__:
        from jupyter_gpushare.backends.kubernetes import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["POD_HOLDERS", "KubernetesBackend", "kubernetes_backend"]
