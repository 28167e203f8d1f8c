"""HAMi-core style virtualisation: ``libvgpu.so`` intercepts CUDA and enforces the slice."""

from __future__ import annotations

import os

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps, mib_limit


class VGPUMode(Mode):
    name = "vgpu"
    enforcement = "hard: HAMi-core interception (libvgpu.so)"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        if facts.simulated or facts.libvgpu_path:
            return None
        return (
            "mode 'vgpu' needs HAMi-core's libvgpu.so: build or install it and set "
            "c.GPUShare.libvgpu_path to the file"
        )

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        env = framework_caps(grant)
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{mib_limit(grant)}m"
        # HAMi-core keeps per-process accounting in a shared file; one per kernel keeps them apart.
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(
            facts.vgpu_cache_directory, f"gpushare-vgpu-{grant.kernel_id}.cache"
        )
        if grant.cores is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(grant.cores)
        if facts.libvgpu_path:
            env["LD_PRELOAD"] = facts.libvgpu_path
        return env
