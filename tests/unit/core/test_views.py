"""docs/reference/rest-api.md shapes and §12: others' slices show as anonymous occupancy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.core.modes import NodeFacts
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import KernelSample, NewRequest, Placed
from jupyter_gpushare.core.views import kernel_view, kernels_view, pool_view

GiB = 2**30

POOL = parse_simulation("1xA100-80GB,1xA100-80GB:mig=1x3g.40gb+2x1g.10gb").devices
POOL_KEYS = {"backend", "simulated", "overcommit", "devices", "queue"}
DEVICE_KEYS = {
    "id",
    "uuid",
    "name",
    "memory_total",
    "memory_reserved",
    "memory_used",
    "utilization",
    "modes",
    "mig",
}
KERNEL_KEYS = {
    "kernel_id", "kernel_name", "path", "owner", "state", "queue_position", "device", "mode",
    "memory_request", "memory_used", "utilization", "warnings",
}  # fmt: skip


def new(
    kernel_id: str, owner: str, size: str, placement: str = "shared", mode: str = "timeslice"
) -> NewRequest:
    return NewRequest(
        kernel_id, owner, f"{owner}-server", mode, placement, size, None, current_process(),  # type: ignore[arg-type]
        kernel_name=f"{kernel_id}-spec", path=f"secret/{kernel_id}.ipynb",
    )  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_devices(POOL, simulated=True)
    for kernel_id, owner, size, placement, mode in [
        ("alice-1", "alice", "10G", "shared", "timeslice"),
        ("bob-1", "bob", "30G", "shared", "timeslice"),
        ("bob-mig", "bob", "5G", "mig", "mig"),
        ("alice-mig", "alice", "5G", "mig", "mig"),
        ("bob-big", "bob", "60G", "shared", "timeslice"),  # does not fit: queued
        ("alice-2", "alice", "2G", "shared", "timeslice"),  # behind bob-big: queued
    ]:
        ledger.enqueue(new(kernel_id, owner, size, placement, mode))
        ledger.try_place(kernel_id, Policy())
    yield ledger
    ledger.close()


def test_the_fixture_has_running_and_queued_slices(ledger: Ledger) -> None:
    states = {record.kernel_id: record.state for record in ledger.records()}
    assert states == {
        "alice-1": "running", "bob-1": "running", "bob-mig": "running", "alice-mig": "running",
        "bob-big": "queued", "alice-2": "queued",
    }  # fmt: skip
    assert not isinstance(ledger.try_place("alice-2", Policy()), Placed)


def test_kernels_view_anonymises_other_owners(ledger: Ledger) -> None:
    view = kernels_view(ledger.records(), ledger.devices(), viewer="alice")
    assert len(view) == 6
    for entry in view:
        assert set(entry) >= KERNEL_KEYS
    mine = [entry for entry in view if entry["owner"] == "alice"]
    theirs = [entry for entry in view if entry["owner"] != "alice"]
    assert sorted(entry["kernel_id"] for entry in mine) == ["alice-1", "alice-2", "alice-mig"]
    assert all(entry["path"] == f"secret/{entry['kernel_id']}.ipynb" for entry in mine)
    assert len(theirs) == 3
    for entry in theirs:
        assert entry["kernel_id"] is None
        assert entry["owner"] == "another user"
        assert not entry["path"]
        assert not entry["kernel_name"]
        assert "bob" not in repr(entry)
    # Occupancy still shows: where, how much, in which state.
    assert sorted((e["state"], e["memory_request"]) for e in theirs) == [
        ("queued", 60 * GiB),
        ("running", 10 * GiB),  # the 1g.10gb MIG instance
        ("running", 30 * GiB),
    ]


def test_kernels_view_positions_and_devices(ledger: Ledger) -> None:
    view = {
        entry["kernel_id"]: entry
        for entry in kernels_view(ledger.records(), ledger.devices(), viewer="alice")
    }
    assert view["alice-2"]["state"] == "queued"
    assert view["alice-2"]["queue_position"] == 2
    assert view["alice-2"]["device"] is None
    assert view["alice-1"]["queue_position"] is None
    assert view["alice-1"]["device"] == 0
    assert view["alice-mig"]["device"] == 1
    assert view["alice-1"]["memory_request"] == 10 * GiB
    assert view["alice-2"]["memory_request"] == 2 * GiB  # queued: what it asks for, in bytes
    assert view["alice-mig"]["memory_request"] == 10 * GiB  # the 1g.10gb instance it holds
    assert isinstance(view["alice-1"]["memory_used"], int)
    assert view["alice-1"]["warnings"] == []


def test_pool_view_shape_and_reserved_memory(ledger: Ledger) -> None:
    pool = pool_view(
        ledger.devices(), ledger.records(), NodeFacts(simulated=True, mig_instances=3),
        backend="local", simulated=True, overcommit=1.0, viewer="alice",
    )  # fmt: skip
    assert set(pool) >= POOL_KEYS
    assert (pool["backend"], pool["simulated"], pool["overcommit"]) == ("local", True, 1.0)
    plain, mig = pool["devices"]
    for device in (plain, mig):
        assert set(device) >= DEVICE_KEYS
        assert isinstance(device["memory_total"], int) and isinstance(device["memory_used"], int)
        assert device["utilization"] is None or 0 <= device["utilization"] <= 100
    assert (plain["id"], plain["memory_total"], plain["memory_reserved"]) == (0, 80 * GiB, 40 * GiB)
    assert mig["memory_reserved"] == 20 * GiB  # two 1g.10gb instances
    assert "mig" not in plain["modes"] and "timeslice" in plain["modes"]
    assert mig["modes"] == ["mig"]
    assert [instance["in_use"] for instance in mig["mig"]] == [False, True, True]


def test_pool_view_anonymises_the_queue_and_mig_instances(ledger: Ledger) -> None:
    pool = pool_view(
        ledger.devices(), ledger.records(), NodeFacts(simulated=True),
        backend="local", simulated=True, overcommit=1.0, viewer="alice",
    )  # fmt: skip
    queue = pool["queue"]
    assert [entry["position"] for entry in queue] == [1, 2]
    assert queue[0]["kernel_id"] is None
    assert queue[0]["owner"] == "another user"
    assert queue[0]["memory_request"] == 60 * GiB  # bytes, as every memory figure
    assert (queue[1]["kernel_id"], queue[1]["owner"]) == ("alice-2", "alice")
    kernel_ids = sorted(str(instance["kernel_id"]) for instance in pool["devices"][1]["mig"])
    assert kernel_ids == ["None", "None", "alice-mig"]
    assert "bob" not in repr(pool)


def test_modes_offered_follow_what_the_node_can_honour(ledger: Ledger) -> None:
    def plain_modes(facts: NodeFacts) -> list[str]:
        pool = pool_view(
            ledger.devices(), [], facts, backend="local", simulated=False, overcommit=1.0, viewer="alice"
        )
        return pool["devices"][0]["modes"]

    bare = plain_modes(NodeFacts(simulated=False))
    assert "exclusive" in bare and "timeslice" in bare
    assert "mps" not in bare and "vgpu" not in bare
    equipped = plain_modes(NodeFacts(mps_pipe_directory="/tmp/mps", libvgpu_path="/lib/libvgpu.so"))
    assert "mps" in equipped and "vgpu" in equipped
    assert "mig" not in equipped


def test_kernel_view_carries_sampled_usage_and_warnings_of_ones_own_kernels(ledger: Ledger) -> None:
    near = "near its slice: using 9.5G of 10G (95%)"
    ledger.record_usage(
        [
            KernelSample("alice-1", 9 * GiB + 512 * 2**20, 40, "nvml", (near,)),
            KernelSample("bob-1", 31 * GiB, 70, "nvml", ("above its slice: using 31G of 30G (103%)",)),
        ]
    )
    ledger.report_usage("alice-mig", 2 * GiB, None, source="kernel")

    view = kernels_view(ledger.records(), ledger.devices(), viewer="alice")
    for entry in view:
        assert set(entry) >= KERNEL_KEYS | {"usage_source"}
    mine = {entry["kernel_id"]: entry for entry in view if entry["owner"] == "alice"}
    assert (mine["alice-1"]["memory_used"], mine["alice-1"]["utilization"]) == (9 * GiB + 512 * 2**20, 40)
    assert mine["alice-1"]["usage_source"] == "nvml"
    assert mine["alice-1"]["warnings"] == [near]
    assert (mine["alice-mig"]["memory_used"], mine["alice-mig"]["usage_source"]) == (2 * GiB, "kernel")
    assert mine["alice-mig"]["utilization"] is None
    # Never sampled (queued): nothing used, no source.
    assert (mine["alice-2"]["memory_used"], mine["alice-2"]["usage_source"]) == (0, None)
    assert mine["alice-2"]["warnings"] == []


def test_kernel_view_hides_the_warnings_of_another_owners_kernel(ledger: Ledger) -> None:
    warning = "above its slice: using 31G of 30G (103%)"
    ledger.record_usage([KernelSample("bob-1", 31 * GiB, 70, "nvml", (warning,))])
    (bob_1,) = [record for record in ledger.records() if record.kernel_id == "bob-1"]

    theirs = kernel_view(bob_1, ledger.devices(), None, viewer="alice")
    assert theirs["warnings"] == []
    assert theirs["kernel_id"] is None and theirs["owner"] == "another user"
    assert warning not in repr(theirs) and "bob" not in repr(theirs)
    # Their owner sees them.
    assert kernel_view(bob_1, ledger.devices(), None, viewer="bob")["warnings"] == [warning]


def test_a_warnings_only_sample_keeps_the_kernels_own_report_in_the_view(ledger: Ledger) -> None:
    ledger.report_usage("alice-1", 3 * GiB, 25, source="kernel")
    ledger.record_usage([KernelSample("alice-1", None, None, None, ("GPU0 is saturated",))])
    (entry,) = [
        e for e in kernels_view(ledger.records(), ledger.devices(), "alice") if e["kernel_id"] == "alice-1"
    ]
    assert (entry["memory_used"], entry["utilization"], entry["usage_source"]) == (3 * GiB, 25, "kernel")
    assert entry["warnings"] == ["GPU0 is saturated"]
