"""A sixth sharing mode, ``toy``, as another package would add one (docs/development.md, "Adding
a mode"); tests/integration/test_toy_mode.py installs it beside jupyter_gpushare, has the picker
offer it, starts a kernel in it and renders its pod.

It registers a :class:`~jupyter_gpushare.core.modes.Mode` subclass under the entry-point group
``jupyter_gpushare.modes`` (the test writes the distribution's ``entry_points.txt``), and answers
every question about itself here: a local node with a GPU honours it, a local kernel gets the
framework caps and the toy's own limit variable, a kernel pod asks for one ``example.com/toy-gpu``
(or, under DRA, a slice of a card that takes several claims), and the nodes that advertise that
resource offer it. Nothing enforces its slices: the watchdog watches them, as time-slicing's.
"""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.core.modes import Grant, Mode, NodeFacts
from jupyter_gpushare.core.modes.base import framework_caps
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.dra import Alternative, shared_alternative
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import PodRequest, shared_replica
from jupyter_gpushare.core.sizes import MiB, Size

RESOURCE = "example.com/toy-gpu"  # what a toy kernel pod asks a device-plugin cluster for
LIMIT = "TOY_MODE_LIMIT_MIB"  # the slice, in MiB, in the kernel's environment


def limit(memory: int) -> dict[str, str]:
    return {LIMIT: str(memory // MiB)}


class ToyMode(Mode):
    name = "toy"
    soft_limit = True
    enforcement = "soft: the toy's own limit variable"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        return None if facts.has_devices else "mode 'toy' needs a GPU"

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        return {**framework_caps(grant), **limit(grant.memory)}

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        request = shared_replica(RESOURCE, size, cluster)
        if request.memory is not None:
            request.env.update(limit(request.memory))
        return request

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        return shared_alternative(self.name, size, cluster, None, extra_env=limit)

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        return RESOURCE in node.allocatable

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        return any(device.shared for device in devices if not device.is_mig)
