"""CUDA MPS: a hard per-client memory limit and an active-thread share, from a running daemon."""

from __future__ import annotations

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps, mib_limit


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
        # The kernel sees exactly one device, so the limit applies to its ordinal 0.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib_limit(grant)}M"
        if grant.cores is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(grant.cores)
        if facts.mps_pipe_directory:
            env["CUDA_MPS_PIPE_DIRECTORY"] = facts.mps_pipe_directory
        return env
