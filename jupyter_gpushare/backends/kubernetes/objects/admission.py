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

import heapq
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
    cards = {node.name: node.card_memory for node in nodes}
    rooms = Rooms([NodeRoom(name, room, cards.get(name)) for name, room in free.items()])
    for amount in sorted(waiting, reverse=True):
        rooms.take(amount)
    return rooms.rooms()


class Rooms:
    """The nodes' rooms while a round admits starts: each admitted start takes its memory from
    the node with the most room, as :func:`node_rooms` gives waiting pods theirs. The roomiest
    node is the top of a heap (stale entries skipped), so a round of many starts on many nodes
    costs a logarithm per start, not a pass over every node."""

    def __init__(self, rooms: Sequence[NodeRoom]) -> None:
        self._order = [room.name for room in rooms]
        self._free = {room.name: room.free for room in rooms}
        self._cards = {room.name: room.card for room in rooms}
        self._heap = [(-room.free, room.name) for room in rooms]
        heapq.heapify(self._heap)

    def _roomiest(self) -> str | None:
        while self._heap:
            free, name = self._heap[0]
            if -free == self._free[name]:
                return name
            heapq.heappop(self._heap)  # an entry from before the node's last change
        return None

    def take(self, amount: int) -> None:
        """``amount`` bytes placed on the node with the most room."""
        name = self._roomiest()
        if name is None:
            return
        self._free[name] -= amount
        heapq.heappush(self._heap, (-self._free[name], name))

    def why_not(self, wanted: int | None) -> str | None:
        """None when a pod asking for ``wanted`` bytes fits now (or cannot be judged); else why
        it waits, as a sentence for its queue entry."""
        if wanted is None:
            return None
        roomiest = self._roomiest()
        if roomiest is None:
            return None  # no node says what it offers: the scheduler decides
        best = self._free[roomiest]
        card = self._cards[roomiest]
        if best >= wanted and (card is None or wanted <= card):
            return None
        # The roomiest node's card may be too small where another node's is not: look at all.
        if best >= wanted and any(
            free >= wanted and (self._cards[name] is None or wanted <= (self._cards[name] or 0))
            for name, free in self._free.items()
        ):
            return None
        return (
            f"{format_bytes(wanted)} does not fit now: {format_bytes(max(best, 0))} free on the GPU "
            "node with the most room"
        )

    def rooms(self) -> list[NodeRoom]:
        return [NodeRoom(name, self._free[name], self._cards[name]) for name in self._order]


def why_not_now(
    wanted: int | None, nodes: Sequence[NodeGPUs], slices: Sequence[PodSlice], unseen: Sequence[int] = ()
) -> str | None:
    """None when a pod asking for ``wanted`` bytes fits now (or cannot be judged); else why it
    waits, as a sentence for its queue entry."""
    if wanted is None:
        return None
    return Rooms(node_rooms(nodes, slices, unseen)).why_not(wanted)


__all__ = ["NodeRoom", "Rooms", "node_rooms", "why_not_now"]
