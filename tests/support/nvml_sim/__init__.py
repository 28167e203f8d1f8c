"""A simulated NVML at NVML's C ABI: ``libnvidia-ml.so.1`` built from libnvidia-ml.c, and the
state file it serves, written from Python.

- ``library``: builds the C library once per source (cached under build/nvml/) and says where it
  is, laid out as a driver root; how a process finds it (``LD_LIBRARY_PATH``, or loading it into
  this process for the real ``pynvml``).
- ``state``: the simulated cards, their processes, samples and Xid errors, written atomically to
  the one file the library reads (its format is in libnvidia-ml.c's header comment).
"""

from .library import STATE_VARIABLE, DriverRoot, driver_root, load_into_pynvml
from .state import SimulatedCard, SimulatedProcess, UtilizationSample, cards_from_inventory, write_state

__all__ = [
    "STATE_VARIABLE",
    "DriverRoot",
    "SimulatedCard",
    "SimulatedProcess",
    "UtilizationSample",
    "cards_from_inventory",
    "driver_root",
    "load_into_pynvml",
    "write_state",
]
