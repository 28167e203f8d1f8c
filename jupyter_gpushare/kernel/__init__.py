"""The kernel side: ``%gpu`` magics, framework caps, and the Python API behind them.

Loaded in every gpushare kernel; anywhere else with ``%load_ext jupyter_gpushare``.
"""

from __future__ import annotations

import os
from typing import Any

_activity: Any = None


def load_ipython_extension(shell: Any) -> None:
    """Register ``%gpu``, cap frameworks on import, and start the activity hooks.

    Only light modules load here: the service behind the magics is built on first use, so a
    kernel is ready as fast with the extension as without it.
    """
    global _activity
    from . import caps
    from .activity import ActivityWatch
    from .magics import GPUMagics

    caps.install_import_hook()
    shell.register_magics(GPUMagics)
    from . import pod

    in_pod = pod.current()
    if in_pod is not None:
        in_pod.start_reporting()  # the server shows this kernel's GPU use from these reports
        return  # a pod's slice is the pod's: nothing to release when idle, no ledger to read
    if _activity is None:
        from .api import own_slice

        idle_after = float(os.environ.get("JUPYTER_GPUSHARE_IDLE_RELEASE_AFTER") or 0)
        _activity = ActivityWatch(own_slice, idle_after)
        _activity.register(shell)


def __getattr__(name: str) -> Any:
    # status(), pool(), request()… import the service only when first called.
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(name)


_API = ("pool", "release", "request", "resize", "simulate_usage", "status", "watch")


__all__ = [
    "load_ipython_extension",
    "pool",
    "release",
    "request",
    "resize",
    "simulate_usage",
    "status",
    "watch",
]
