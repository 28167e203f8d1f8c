"""The clusters the emulator's DRA tests run: nodes with no extended GPU resources whose GPUs are
in ResourceSlices (as NVIDIA's and HAMi's DRA drivers publish them: tests/cluster/dra_devices.py),
with a :class:`~.dra.DraSimulation` to allocate them.
"""

from __future__ import annotations

from ...cluster.dra_devices import HAMI, NVIDIA, hami_driver, nvidia_driver
from ...cluster.nodes import dra_nodes
from .dra import DraSimulation


def nvidia_cluster(count: int = 4, mig_node: bool = True, shared: bool = False) -> DraSimulation:
    """NVIDIA's driver: one 80 GiB A100 per node; the last node's card split into MIG devices
    (two 1g.10gb, one 3g.40gb) where ``mig_node``."""
    driver = nvidia_driver(count, mig_node, shared)
    return DraSimulation(driver.slices, driver.classes)


def hami_cluster(count: int = 4) -> DraSimulation:
    driver = hami_driver(count)
    return DraSimulation(driver.slices, driver.classes)


__all__ = ["HAMI", "NVIDIA", "dra_nodes", "hami_cluster", "nvidia_cluster"]
