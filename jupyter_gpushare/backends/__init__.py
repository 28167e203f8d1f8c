"""Where slices come from: one backend object per process and settings, chosen here once.

``c.GPUShare.backend`` picks it: ``local`` (the node ledger, :mod:`.local`) or ``kubernetes``
(kernel pods, :mod:`.kubernetes`). Everything above — the server extension, the CLI, the
metrics — holds a :class:`~.base.Backend` and never asks which.
"""

from __future__ import annotations

from ..config import GPUShare
from .base import Backend, ServerHooks, ServerKernels


def backend_for(settings: GPUShare) -> Backend:
    """This process's backend for ``settings`` (built once; NVML probed or cluster reached once)."""
    if settings.backend == "kubernetes":
        from .kubernetes import kubernetes_backend

        return kubernetes_backend(settings)
    from .local import local_backend

    return local_backend(settings)


__all__ = ["Backend", "ServerHooks", "ServerKernels", "backend_for"]
