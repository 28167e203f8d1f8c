"""Where a process takes slices for local kernels: the GPU broker that holds the node ledger
(``c.GPUShare.broker_url``), else the node ledger itself."""

from __future__ import annotations

from jupyter_gpushare.backends.broker_client.backend import remote_backend
from jupyter_gpushare.backends.local.per_process import local_backend
from jupyter_gpushare.backends.protocol import NodeSlices
from jupyter_gpushare.config import GPUShare


def node_slices_for(settings: GPUShare) -> NodeSlices:
    """Where this process takes slices for local kernels: the broker, else the node ledger."""
    if settings.effective_broker_url():
        return remote_backend(settings)
    return local_backend(settings)


__all__ = ["node_slices_for"]
