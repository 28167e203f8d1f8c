"""The local backend's room: kernels as processes on this node, their slices in the node ledger.

:mod:`.backend` (the ledger as a :class:`~jupyter_gpushare.backends.base.Backend`; its checks
:mod:`.checks`, views :mod:`.views`, sampler :mod:`.monitor`, what a kernel holds
:mod:`.holding`, suspend and resume :mod:`.suspend`) and :mod:`.provisioner` (a kernel process
taking its slice from the ledger or from the broker that holds it).
"""

from __future__ import annotations

from .backend import LocalBackend
from .per_process import local_backend

__all__ = ["LocalBackend", "local_backend"]
