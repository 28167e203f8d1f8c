"""Where slices come from: one backend object per process and settings, chosen here once.

``c.GPUShare.backend`` picks it: ``local`` (the node ledger, :mod:`.local`) or ``kubernetes``
(kernel pods, :mod:`.kubernetes`) — unless ``c.GPUShare.broker_url`` names a GPU broker, which
then holds the ledger or the cluster for every user (:mod:`.remote` is its client). Everything
above — the server extension, the CLI, the metrics, the provisioners, ``%gpu`` — holds a
:class:`~.base.Backend` and never asks which.
"""

from __future__ import annotations

from ..config import GPUShare
from .base import Backend, NodeSlices, ServerHooks, ServerKernels


def backend_for(settings: GPUShare) -> Backend:
    """This process's backend for ``settings`` (built once; NVML probed or cluster reached once)."""
    if settings.effective_broker_url():
        from .remote import remote_backend

        return remote_backend(settings)
    if settings.backend == "kubernetes":
        from .kubernetes import kubernetes_backend

        return kubernetes_backend(settings)
    from .local import local_backend

    return local_backend(settings)


__all__ = ["Backend", "NodeSlices", "ServerHooks", "ServerKernels", "backend_for"]
