"""The simulated GPU nodes, and the resources a pod asks of one: the real cluster's node side's
(tests/cluster/nodes.py), which the emulator's scheduler (scheduler.py) places pods on by their
:func:`pod_limits` against the nodes' allocatable resources.
"""

from __future__ import annotations

from ...cluster.nodes import SimNode, hami_nodes, pod_limits, quantity

__all__ = ["SimNode", "hami_nodes", "pod_limits", "quantity"]
