"""What starting a kernel pod would do now, from the watched cluster: ``GET fit`` on the
Kubernetes backend. Pure.

The scheduler decides, not us; what we can say is read from the nodes' GPU labels and
allocatable resources and from the kernel pods we see (pods of other applications are not ours
to read): a node offering the mode with room for the size (the pod would be placed now), none
with room now (it would wait, behind the kernel pods already waiting), or none that could ever
hold it (larger than any card, above a limit, a mode no node offers).
"""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, held_by_user, never_fits, node_modes
from jupyter_gpushare.backends.kubernetes.objects.pool import waiting as waiting_pods
from jupyter_gpushare.core.placement.allocator import kernel_limit_refusal
from jupyter_gpushare.core.placement.preview import Preview, budget_summary, never, waiting
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.pods.presets import ResourcePreset
from jupyter_gpushare.core.sizes import Size, format_bytes


def preview_pod(
    size: Size,
    mode: str,
    owner: str,
    nodes: Sequence[NodeGPUs],
    slices: Sequence[PodSlice],
    preset: ResourcePreset,
    *,
    max_memory_per_kernel: int | None = None,
    max_memory_per_user: int | None = None,
) -> Preview:
    """What a kernel pod of ``size`` in ``mode`` for ``owner`` would do now."""
    if not nodes:
        return never("the cluster has no GPU node", "no GPU node in the cluster")
    if size.form == "bytes":
        wanted = size.resolve(0)
        too_large = never_fits(wanted, nodes)
        if too_large is not None:
            return never(too_large, "larger than any card")
        over_kernel = kernel_limit_refusal(wanted, max_memory_per_kernel)
        if over_kernel is not None and max_memory_per_kernel is not None:
            return never(over_kernel, f"above the {format_bytes(max_memory_per_kernel)} limit per kernel")
        held = held_by_user(slices, owner)
        if max_memory_per_user is not None and held + wanted > max_memory_per_user:
            summary = budget_summary(max_memory_per_user, held)
            return never(f"{format_bytes(wanted)} would be {summary}", summary)
    offering = [node for node in nodes if mode in node_modes(node, preset)]
    if not offering:
        return never(f"no GPU node of the cluster offers mode {mode!r}", f"no node offers {mode}")
    rooms = [(node, _free(node, slices), _wanted(size, node)) for node in offering]
    # Best fit, as the local allocator: the node left with the least room; ties by name.
    fitting = [(free - want, node.name, node, free, want) for node, free, want in rooms if want <= free]
    if fitting:
        _, _, node, free, wanted = min(fitting, key=lambda candidate: candidate[:2])
        summary = f"fits now on {node.name}, {format_bytes(free)} free"
        return Preview("now", summary, node=node.name, free=free, memory=wanted)
    roomiest, most = max(((node, free) for node, free, _ in rooms), key=lambda pair: pair[1])
    reason = f"{size} does not fit now: {format_bytes(most)} free on {roomiest.name}"
    # A kernel pod waits for the scheduler whatever GPUShare.when_full says.
    return waiting(len(waiting_pods(slices)) + 1, reason, "queue")


def _free(node: NodeGPUs, slices: Sequence[PodSlice]) -> int:
    """Bytes of the node's GPU memory that none of the kernel pods placed there holds (under
    DRA: that no allocated claim holds, whoever made it)."""
    if node.claimed is not None:
        return max(0, node.memory_total - node.claimed)
    reserved = sum(item.memory or 0 for item in slices if item.node == node.name and item.placed)
    return max(0, node.memory_total - reserved)


def _wanted(size: Size, node: NodeGPUs) -> int:
    """Bytes the slice would hold on ``node``: a share or a whole card is read against its card."""
    card = node.card_memory or node.memory_total
    if size.is_whole:
        return card
    return size.resolve(card)
