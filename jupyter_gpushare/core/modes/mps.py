"""CUDA MPS: a hard per-client memory limit and an active-thread share, from a running daemon."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.dra import (
    Alternative,
    dra_names,
    gpu_config,
    quantity,
    shared_alternative,
    whole_card_alternative,
)
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import (
    PodRequest,
    TemplatedRequest,
    bytes_for,
    shared_replica,
)
from jupyter_gpushare.core.sizes import MiB, Size


def client_limits(memory: int | None, cores: int | None) -> dict[str, str]:
    """MPS's client variables: the pinned memory limit (rounded down to MiB, so it never allows
    more than was reserved) and the active thread share. The kernel sees exactly one device, so
    the limit applies to its ordinal 0."""
    env: dict[str, str] = {}
    if memory is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory // MiB}M"
    if cores is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
    return env


class MPSMode(Mode):
    name = "mps"
    enforcement = "hard: MPS pinned device memory limit"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        if facts.simulated or facts.mps_pipe_directory:
            return None
        return (
            "mode 'mps' needs a running MPS control daemon: start it with "
            "`nvidia-cuda-mps-control -d` (or set c.GPUShare.mps_pipe_directory to its pipe directory)"
        )

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        env = framework_caps(grant)
        env.update(client_limits(grant.memory, grant.cores))
        if facts.mps_pipe_directory:
            env["CUDA_MPS_PIPE_DIRECTORY"] = facts.mps_pipe_directory
        return env

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        request = shared_replica(cluster.preset.mps_gpu, size, cluster)
        # The device plugin's MPS sharing enforces memory per client through the same variables.
        request.env.update(client_limits(None if size.is_whole else request.memory, cores))
        return request

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        """NVIDIA's driver runs the MPS daemon and enforces the pinned limit from the claim's
        configuration; other drivers get MPS's client variables, as device-plugin pods do."""
        names = dra_names(cluster)
        if size.is_whole:
            return whole_card_alternative(size, cluster)
        memory = bytes_for(size, cluster.gpu_memory, percent_resource=False)
        assert memory is not None
        mps_config: dict[str, Any] = {"defaultPinnedDeviceMemoryLimit": quantity(memory)}
        if cores is not None:
            mps_config["defaultActiveThreadPercentage"] = cores
        parameters = gpu_config(names, {"strategy": "MPS", "mpsConfig": mps_config})

        def mps_env(memory: int) -> dict[str, str]:
            return {} if parameters is not None else client_limits(memory, cores)

        return shared_alternative(self.name, size, cluster, parameters, extra_env=mps_env)

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        renamed = preset.mps_gpu != preset.gpu and preset.mps_gpu in node.allocatable
        return node.sharing == "mps" or renamed

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        return any(not device.is_mig for device in devices)

    def templated_request(self, preset: ResourcePreset, cores: int | None) -> TemplatedRequest:
        return TemplatedRequest("MiB", PodRequest({preset.mps_gpu: "1"}))
