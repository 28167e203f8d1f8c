"""The local backend's room: kernels as processes on this node, their slices in the node ledger.

:mod:`.backend` (the ledger as a :class:`~jupyter_gpushare.backends.protocol.Backend`; its checks
:mod:`.checks`, views :mod:`.views`, sampler :mod:`.monitor`, what a kernel holds
:mod:`.holding`, suspend and resume :mod:`.suspend`) and :mod:`.provisioner` (a kernel process
taking its slice from the ledger or from the broker that holds it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.backend import LocalBackend
    from jupyter_gpushare.backends.local.per_process import local_backend


def __getattr__(name: str) -> Any:
    # Imported on first use: a kernel looking its kind up (:mod:`.kind`) loads no backend.
    if name == "LocalBackend":
        from jupyter_gpushare.backends.local.backend import LocalBackend

        return LocalBackend
    if name == "local_backend":
        from jupyter_gpushare.backends.local.per_process import local_backend

        return local_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LocalBackend", "local_backend"]
