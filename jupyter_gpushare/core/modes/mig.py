"""MIG: a hardware partition; the kernel gets the smallest free instance that fits."""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.core.errors import ModeUnavailableError
from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.dra import Alternative, dra_names, profile_is
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import PodRequest, smallest_mig_profile
from jupyter_gpushare.core.sizes import Size


class MIGMode(Mode):
    name = "mig"
    placement = "mig"
    enforcement = "hardware partition"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        if facts.mig_instances:
            return None
        return (
            "mode 'mig' needs MIG instances: enable MIG (`nvidia-smi -i 0 -mig 1`) and create "
            "instances (`nvidia-smi mig -cgi 1g.10gb -C`)"
        )

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        return framework_caps(grant)

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        """The smallest MIG profile the cluster advertises that holds the size."""
        if not cluster.mig_profiles and not size.is_whole:
            raise ModeUnavailableError(
                "mode 'mig' needs MIG profiles: no node advertises nvidia.com/mig-* resources "
                "(or set c.GPUShare.mig_profiles)"
            )
        profile, memory = smallest_mig_profile(size, cluster)
        return PodRequest({f"{cluster.preset.mig_prefix}{profile}": "1"}, memory=memory)

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        names = dra_names(cluster)
        if not names.mig_device_class:
            raise ModeUnavailableError(
                f"resource preset {cluster.preset.name!r} has no MIG device class: set "
                "c.GPUShare.dra_mig_device_class (e.g. 'mig.nvidia.com')"
            )
        if not cluster.mig_profiles and not size.is_whole:
            raise ModeUnavailableError(
                f"mode 'mig' needs MIG devices: no ResourceSlice of {names.driver} offers one "
                "(or set c.GPUShare.mig_profiles)"
            )
        profile, memory = smallest_mig_profile(size, cluster)
        return Alternative(self.name, names.mig_device_class, (profile_is(names, profile),), memory=memory)

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        return bool(node.mig)

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        return bool(names.mig_device_class) and any(device.is_mig for device in devices)
