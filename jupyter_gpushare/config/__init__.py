"""The ``c.GPUShare`` traits (:mod:`.traits`), where each setting comes from (:mod:`.layers`),
how any process finds them (:mod:`.loading`), the backend kinds installed (:mod:`.kinds`), the
broker's own traits (:mod:`.broker`) and the gpushare kernelspecs (:mod:`.kernelspecs`).

The names below are imported on first use: a kernel looking up its kind (:mod:`.kinds`) before
its first cell loads no traitlets configuration.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpushare.config.layers import Ignored, Layer, Settled
    from jupyter_gpushare.config.loading import load_settings, settings_env, unreported_warnings
    from jupyter_gpushare.config.traits import LEDGER_FILENAME, GPUShare, broker_address_problem

_WHERE = {
    "Ignored": "layers",
    "Layer": "layers",
    "Settled": "layers",
    "load_settings": "loading",
    "settings_env": "loading",
    "unreported_warnings": "loading",
    "LEDGER_FILENAME": "traits",
    "GPUShare": "traits",
    "broker_address_problem": "traits",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LEDGER_FILENAME",
    "GPUShare",
    "Ignored",
    "Layer",
    "Settled",
    "broker_address_problem",
    "load_settings",
    "settings_env",
    "unreported_warnings",
]
