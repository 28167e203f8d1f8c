"""Time-slicing: kernels share a card's memory; caps are soft (framework limits + watchdog)."""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.dra import Alternative, dra_names, gpu_config, shared_alternative
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import PodRequest, TemplatedRequest, shared_replica
from jupyter_gpushare.core.sizes import Size


class TimesliceMode(Mode):
    name = "timeslice"
    soft_limit = True
    live_resize = True  # the reservation and PyTorch/CuPy caps can move; JAX/TF need a restart
    enforcement = "soft: framework caps and watchdog"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        return None

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        return framework_caps(grant)

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        return shared_replica(cluster.preset.timeslice_gpu, size, cluster)

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
        return shared_alternative(self.name, size, cluster, gpu_config(dra_names(cluster), sharing))

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        # The device plugin's time-slicing replicas, under its own name or a renamed resource.
        renamed = preset.timeslice_gpu != preset.gpu and preset.timeslice_gpu in node.allocatable
        return node.sharing == "time-slicing" or renamed

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        return any(not device.is_mig for device in devices)

    def templated_request(self, preset: ResourcePreset, cores: int | None) -> TemplatedRequest:
        return TemplatedRequest("MiB", PodRequest({preset.timeslice_gpu: "1"}))
