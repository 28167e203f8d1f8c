"""The kernel side: ``%gpu`` magics, framework caps, and the Python API behind them.

Loaded in every gpushare kernel; anywhere else with ``%load_ext jupyter_gpushare``.
"""

from __future__ import annotations

import logging
from typing import Any

_started = False


def load_ipython_extension(shell: Any) -> None:
    """Register ``%gpu``, cap frameworks on import, and start what this kernel's slice does in
    the background (usage reports from a pod; warnings and the idle timer locally).

    Only light modules load here: the backend behind the magics is built on first use, so a
    kernel is ready as fast with the extension as without it.
    """
    global _started
    from jupyter_gpushare.kernel import caps
    from jupyter_gpushare.kernel.magics import GPUMagics
    from jupyter_gpushare.kernel.slice_handle import slice_handle

    caps.install_import_hook()
    shell.register_magics(GPUMagics)
    if not _started:
        from jupyter_gpushare.core.errors import GPUShareError

        try:
            handle = slice_handle()
        except GPUShareError as error:  # an unknown kind: the kernel runs on, %gpu says why
            logging.getLogger("jupyter_gpushare").warning("GPU: %s", error)
            return
        handle.start(shell)
        _started = True


def __getattr__(name: str) -> Any:
    # status(), pool(), request()… import the service only when first called.
    if name in _API:
        from jupyter_gpushare.kernel import api

        return getattr(api, name)
    raise AttributeError(name)


_API = ("pool", "release", "request", "resize", "resume", "simulate_usage", "status", "suspend", "watch")


__all__ = [
    "load_ipython_extension",
    "pool",
    "release",
    "request",
    "resize",
    "resume",
    "simulate_usage",
    "status",
    "suspend",
    "watch",
]
