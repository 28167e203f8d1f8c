"""The ``c.GPUShare`` traits (:mod:`.traits`) and how any process finds them (:mod:`.loading`)."""

from .loading import config_from_files, load_settings, read_config_files, settings_env
from .traits import LEDGER_FILENAME, GPUShare, broker_address_problem

__all__ = [
    "LEDGER_FILENAME",
    "GPUShare",
    "broker_address_problem",
    "config_from_files",
    "load_settings",
    "read_config_files",
    "settings_env",
]
