"""The ``c.GPUShare`` traits (:mod:`.traits`), where each setting comes from (:mod:`.layers`) and
how any process finds them (:mod:`.loading`)."""

from jupyter_gpushare.config.layers import Ignored, Layer, Settled
from jupyter_gpushare.config.loading import load_settings, settings_env, unreported_warnings
from jupyter_gpushare.config.traits import LEDGER_FILENAME, GPUShare, broker_address_problem

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
