"""Whether a kernel pod fits the cluster now, as the broker sees it. Pure.

The broker keeps one FIFO queue of kernel pod starts for all users and creates a pod only when
its view of the cluster — the GPU memory each node offers, less what bound pods hold and what
pods still waiting for the scheduler will take — says the pod fits. The scheduler keeps the last
word: an admitted pod that still cannot be placed fails with the scheduler's reason.

Only slices of a known size in bytes are judged; a whole card or a MIG instance (no byte size) and
nodes that say nothing of their memory are left to the scheduler. Under a DRA preset the nodes are
the DRA pool's (:func:`~jupyter_gpushare.backends.kubernetes.objects.dra_pool.dra_nodes`:
ResourceSlices, and what every allocated ResourceClaim holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.sizes import format_bytes


@dataclass(frozen=True)
class NodeRoom:
    """What one node can still take."""

    name: str
    free: int  # bytes of GPU memory no pod holds or waits for
    card: int | None  # the largest slice one card can hold, where known


def node_rooms(
    nodes: Sequence[NodeGPUs], slices: Sequence[PodSlice], unseen: Sequence[int] = ()
) -> list[NodeRoom]:
    """Each node's free memory after the pods bound to it, then after the pods not bound yet
    (waiting ones, and admitted ones the watch has not shown yet: ``unseen``), each given to the
    node with the most room, largest first — the scheduler will put them somewhere. A pod Kueue
    holds behind its gate takes no room: it waits for quota, and may wait longer than pods
    started after it."""
    held: dict[str, int] = {}
    waiting: list[int] = list(unseen)
    for item in slices:
        if item.ended or item.memory is None or item.held_by_kueue is not None:
            continue
        if item.node:
            held[item.node] = held.get(item.node, 0) + item.memory
        elif not item.deleting:
            waiting.append(item.memory)
    # Under DRA a node's allocated claims say what is held there, whoever made them (another
    # namespace's claims occupy the devices too); our pods' claims may not show as allocated yet.
    free = {
        node.name: node.memory_total - max(held.get(node.name, 0), node.claimed or 0)
        for node in nodes
        if node.memory_total
    }
    for amount in sorted(waiting, reverse=True):
        if not free:
            break
        roomiest = max(free, key=lambda name: free[name])
        free[roomiest] -= amount
    cards = {node.name: node.card_memory for node in nodes}
    return [NodeRoom(name, room, cards.get(name)) for name, room in free.items()]


def why_not_now(
    wanted: int | None, nodes: Sequence[NodeGPUs], slices: Sequence[PodSlice], unseen: Sequence[int] = ()
) -> str | None:
    """None when a pod asking for ``wanted`` bytes fits now (or cannot be judged); else why it
    waits, as a sentence for its queue entry."""
    if wanted is None:
        return None
    rooms = node_rooms(nodes, slices, unseen)
    if not rooms:
        return None  # no node says what it offers: the scheduler decides
    if any(room.free >= wanted and (room.card is None or wanted <= room.card) for room in rooms):
        return None
    best = max(room.free for room in rooms)
    return (
        f"{format_bytes(wanted)} does not fit now: {format_bytes(max(best, 0))} free on the GPU node "
        "with the most room"
    )


__all__ = ["NodeRoom", "node_rooms", "why_not_now"]
