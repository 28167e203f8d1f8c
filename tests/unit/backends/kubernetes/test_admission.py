"""The broker's view of whether a kernel pod fits now (one FIFO queue for all users)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpushare.backends.kubernetes.objects.admission import Rooms, node_rooms, why_not_now
from jupyter_gpushare.backends.kubernetes.objects.kueue import ADMISSION_GATE
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, read_pod
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from tests.support.k8s_pods import build, settings

G = 1 << 30


def node(name: str, memory: int, card: int | None = None) -> NodeGPUs:
    return NodeGPUs(name, "A100", card, 1, None, None, memory)


def pod(
    kernel_id: str, memory: int | None, node_name: str | None, phase: str = "Running", deleting: bool = False
) -> PodSlice:
    return PodSlice(
        kernel_id,
        f"pod-{kernel_id}",
        "alice",
        "s",
        "vgpu",
        None,
        memory,
        node_name,
        phase,
        "",
        None,
        deleting,
    )


NODES = [node("a", 16 * G), node("b", 8 * G)]


@pytest.mark.parametrize(
    ("wanted", "slices", "unseen", "fits"),
    [
        (6 * G, [], [], True),
        (16 * G, [], [], True),
        (17 * G, [], [], False),
        (6 * G, [pod("1", 12 * G, "a")], [], True),  # b has 8G
        (10 * G, [pod("1", 12 * G, "a")], [], False),
        # A pod still waiting for the scheduler takes room somewhere: the roomiest node.
        (11 * G, [pod("1", 6 * G, None, "Pending")], [], False),
        (10 * G, [pod("1", 6 * G, None, "Pending")], [], True),
        # Admitted starts the watch does not show yet count the same.
        (11 * G, [], [6 * G], False),
        # Ended pods hold nothing; pods being deleted still do until they are gone.
        (16 * G, [pod("1", 12 * G, "a", "Succeeded")], [], True),
        (16 * G, [pod("1", 12 * G, "a", deleting=True)], [], False),
        # What cannot be judged is the scheduler's: a whole card, MIG.
        (None, [pod("1", 16 * G, "a"), pod("2", 8 * G, "b")], [], True),
    ],
)
def test_fits_now(wanted: int | None, slices: list[PodSlice], unseen: list[int], fits: bool) -> None:
    reason = why_not_now(wanted, NODES, slices, unseen)
    assert (reason is None) is fits, reason
    if not fits:
        assert "does not fit now" in str(reason) and "free on the GPU node with the most room" in str(reason)


def test_a_slice_must_fit_one_card_of_a_node() -> None:
    two_cards = [node("a", 80 * G, card=40 * G)]
    assert why_not_now(40 * G, two_cards, []) is None
    assert why_not_now(41 * G, two_cards, []) is not None


def test_nodes_that_say_nothing_of_their_memory_leave_it_to_the_scheduler() -> None:
    assert node_rooms([node("a", 0)], []) == []
    assert why_not_now(6 * G, [node("a", 0)], [pod("1", 99 * G, "a")]) is None


def test_under_dra_every_allocated_claim_on_a_node_counts_whoever_made_it() -> None:
    # 10G of node a's 16G is held by claims (4G of them our running pod's, 6G another
    # namespace's): 6G is free there, not 12G.
    claimed = NodeGPUs("a", "A100", 16 * G, 1, None, None, 16 * G, claimed=10 * G)
    slices = [pod("k1", 4 * G, "a")]
    [room] = node_rooms([claimed], slices)
    assert room.free == 6 * G
    assert why_not_now(6 * G, [claimed], slices) is None
    assert why_not_now(7 * G, [claimed], slices) is not None
    # Our pod bound before its claim shows as allocated still counts.
    assert (
        node_rooms([NodeGPUs("a", "A100", 16 * G, 1, None, None, 16 * G, claimed=0)], slices)[0].free
        == 12 * G
    )


def test_pods_kueue_holds_behind_its_gate_take_no_node_room() -> None:
    """Kueue holds a pod for quota, not for a node: counting it as about to take room made the
    broker's queue hold later starts ("does not fit now") while the nodes were free."""
    held = [replace(pod(str(n), 8 * G, None, "Pending"), held_by_kueue="gpu") for n in range(3)]
    assert [room.free for room in node_rooms(NODES, held)] == [16 * G, 8 * G]
    assert why_not_now(16 * G, NODES, held) is None
    # Once Kueue admits it (the gate is off), it waits for the scheduler and takes room again.
    admitted = [replace(item, held_by_kueue=None) for item in held[:1]]
    assert why_not_now(16 * G, NODES, admitted) is not None


def test_a_pod_read_from_the_cluster_says_kueue_holds_it() -> None:
    pod_object = build(settings(resource_preset="hami", kueue_queue="gpu"), mode="vgpu", memory="6G")
    made = read_pod(pod_object)
    assert made is not None and made.held_by_kueue is None
    pod_object["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]  # as Kueue's webhook adds it
    item = read_pod(pod_object)
    assert item is not None and item.held_by_kueue == "gpu" and item.memory == 6 * G


def test_starts_admitted_in_one_round_take_room_as_waiting_pods_do() -> None:
    """The broker judges a round's starts against rooms computed once: each admitted start takes
    its memory from the roomiest node, as a waiting pod does, so the round ends where
    node_rooms with those starts unseen would, and the next start is judged on what is left."""
    cards = [node(name, memory) for name, memory in (("a", 16 * G), ("b", 8 * G), ("c", 12 * G))]
    rooms = Rooms(node_rooms(cards, [pod("1", 4 * G, "c")]))
    taken = []
    for wanted in (6 * G, 6 * G, 4 * G, 4 * G):
        assert rooms.why_not(wanted) is None, (wanted, rooms.rooms())
        rooms.take(wanted)
        taken.append(wanted)
    expected = node_rooms(cards, [pod("1", 4 * G, "c")], taken)
    assert sorted(room.free for room in rooms.rooms()) == sorted(room.free for room in expected)
    assert [room.name for room in rooms.rooms()] == ["a", "b", "c"]
    # 24G of 36G held, spread as the scheduler may: 4G left on each; 5G fits nowhere, said.
    assert sorted(room.free for room in rooms.rooms()) == [4 * G, 4 * G, 4 * G]
    assert rooms.why_not(4 * G) is None
    assert rooms.why_not(5 * G) == "5G does not fit now: 4G free on the GPU node with the most room"
    assert rooms.why_not(None) is None


def test_the_roomiest_node_with_too_small_a_card_leaves_the_judgement_to_the_others() -> None:
    """A node with the most memory in all but small cards cannot take a slice larger than a
    card; another node with a card large enough and the room can."""
    rooms = Rooms(node_rooms([node("many-small", 64 * G, 10 * G), node("one-big", 40 * G, 40 * G)], []))
    assert rooms.why_not(20 * G) is None
    rooms.take(30 * G)  # to many-small (the roomiest): 34G left there, 40G on one-big
    assert rooms.why_not(40 * G) is None
    assert rooms.why_not(41 * G) is not None
