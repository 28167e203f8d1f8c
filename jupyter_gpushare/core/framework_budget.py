"""How much of a slice a framework's allocator may take: the slice less its process's CUDA context.

NVML counts everything a process holds on the card — its CUDA context (driver state, loaded
modules) as well as what its framework allocated — and so do the ledger, the over-limit check and
the other kernels packed onto the card. No framework cap includes the context: PyTorch's memory
fraction, CuPy's pool limit and JAX's fraction govern their own allocators only. Measured on an
NVIDIA H200 (driver 580.159, PyTorch 2.11 with CUDA 13.0): a kernel capped at exactly its 10G
slice held 10.5G by NVML's count, 518 MiB of it the context, and was reported over its slice.

Pure code: no I/O.
"""

from __future__ import annotations

from jupyter_gpushare.core.sizes import MiB

# Above the 518 MiB measured for PyTorch's context with nothing allocated: cuBLAS, cuDNN and
# lazily loaded kernels add some as a notebook runs.
CUDA_CONTEXT_ALLOWANCE = 768 * MiB


def framework_budget(slice_memory: int) -> int:
    """The bytes a framework may allocate in a slice of ``slice_memory``: the slice less the
    context allowance, which takes at most a quarter of it so that small slices stay usable."""
    return slice_memory - min(CUDA_CONTEXT_ALLOWANCE, slice_memory // 4)


__all__ = ["CUDA_CONTEXT_ALLOWANCE", "framework_budget"]
