"""Where slices come from: one backend object per process and settings, chosen here once.

``c.GPUShare.backend`` picks its kind in the registry (:mod:`.registry`): ``local`` (the node
ledger, :mod:`.local`), ``kubernetes`` (kernel pods, :mod:`.kubernetes`) or one another package
registers — unless ``c.GPUShare.broker_url`` names a GPU broker, which
then holds the ledger or the cluster for every user (:mod:`.remote` is its client). Everything
above — the server extension, the CLI, the metrics, the provisioners, ``%gpu`` — holds a
:class:`~.base.Backend` and never asks which.
"""

from __future__ import annotations

from ..config import GPUShare
from .base import Backend, NodeSlices, ServerHooks, ServerKernels


def backend_for(settings: GPUShare) -> Backend:
    """This process's backend for ``settings`` (built once; NVML probed or cluster reached once):
    the GPU broker's client where ``c.GPUShare.broker_url`` names one, else the configured kind's."""
    # Imported here: a kernel importing this package for its types loads neither.
    from .registry import kind_for
    from .remote import remote_backend

    if settings.effective_broker_url():
        return remote_backend(settings)
    return kind_for(settings).make_backend(settings)


__all__ = ["Backend", "NodeSlices", "ServerHooks", "ServerKernels", "backend_for"]
