"""Where the pool comes from: NVML on a GPU node, or a simulated description."""

from __future__ import annotations

from jupyter_gpushare.backends.local.inventory.nvml import read_nvml_inventory
from jupyter_gpushare.backends.local.inventory.simulated import parse_simulation
from jupyter_gpushare.core.devices import Device, Inventory, MigInstance
from jupyter_gpushare.core.errors import SimulationSpecError


def discover(simulate: str = "") -> Inventory:
    """The simulated pool when one is described, otherwise what NVML reports."""
    if simulate.strip():
        return parse_simulation(simulate)
    return read_nvml_inventory()


__all__ = [
    "Device",
    "Inventory",
    "MigInstance",
    "SimulationSpecError",
    "discover",
    "parse_simulation",
    "read_nvml_inventory",
]
