"""Measuring what a kernel's processes really hold on the GPU, before the ledger promises it away.

Called by the local backend right before a shrink, a release or a suspend takes effect, and by
the sampler for kernels that released their slice while still holding memory. On a GPU the
figure is NVML's, per process, for the kernel's process tree (the pids NVML lists that are not in
the tree are someone else's). On a simulated pool there is no driver to ask: the kernel's
declared usage stands for it, as it does everywhere else on such a pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from jupyter_gpushare.core.records import Holding, SliceRecord


def process_tree(pid: int) -> frozenset[int]:
    """``pid`` and its descendants (empty when the process is gone)."""
    try:
        process = psutil.Process(pid)
        return frozenset([pid, *(child.pid for child in process.children(recursive=True))])
    except psutil.Error:
        return frozenset()


def measure_nvml(kernel_pid: int, device_uuids: Sequence[str]) -> Holding:
    """NVML's per-process figures for ``kernel_pid``'s tree, on the pool's devices."""
    from jupyter_gpushare.backends.local.usage.nvml_usage import read_snapshot

    snapshot = read_snapshot(device_uuids)
    tree = process_tree(kernel_pid)
    mine = sorted(pid for pid in snapshot.processes if pid in tree)
    return Holding(sum(snapshot.processes[pid].memory for pid in mine), "nvml", tuple(mine))


def declared(record: SliceRecord | None, fallback: tuple[int, str | None] = (0, None)) -> Holding:
    """A simulated pool: what the kernel declared (or reported) it uses."""
    if record is not None and record.usage_source in ("simulated", "kernel"):
        return Holding(record.memory_used or 0, record.usage_source)
    used, source = fallback
    return Holding(used, source)
