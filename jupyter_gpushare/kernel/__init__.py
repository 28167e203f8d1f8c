"""The kernel side: ``%gpu`` magics, framework caps, and the Python API behind them.

Loaded in every gpushare kernel; anywhere else with ``%load_ext jupyter_gpushare``.
"""

from __future__ import annotations

from typing import Any

from .api import pool, release, request, resize, simulate_usage, status, watch

_activity: Any = None


def load_ipython_extension(shell: Any) -> None:
    """Register ``%gpu``, cap frameworks on import, and start the activity hooks."""
    global _activity
    from . import caps
    from .activity import ActivityWatch
    from .api import own_slice
    from .magics import GPUMagics

    caps.install_import_hook()
    shell.register_magics(GPUMagics)
    if _activity is None:
        own = own_slice()
        _activity = ActivityWatch(own, own.service.settings.idle_release_after)
        _activity.register(shell)


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
