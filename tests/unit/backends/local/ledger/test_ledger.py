"""The node ledger: a real sqlite file, real processes for liveness."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import boot_id, current_process, identify, is_alive
from jupyter_gpushare.core.placement.allocator import NoFit, Policy, Spot
from jupyter_gpushare.core.records import (
    DeviceSample,
    KernelSample,
    NewRequest,
    Placed,
    ProcessIdentity,
    Refused,
    SliceRecord,
    Waiting,
)

GiB = 2**30
MiB = 2**20

POOL = parse_simulation("1xT4-16GB,1xA100-80GB:mig=1x3g.40gb+2x1g.10gb")
T4 = POOL.devices[0]
ME = current_process()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_devices(POOL.devices, simulated=True)
    yield ledger
    ledger.close()


@pytest.fixture
def dead_process() -> ProcessIdentity:
    """The identity of a process that ran and has ended."""
    process = subprocess.Popen(["sleep", "30"])
    identity = identify(process.pid)
    assert identity is not None
    process.kill()
    process.wait()
    assert not is_alive(identity)
    return identity


@pytest.fixture
def live_process() -> Iterator[ProcessIdentity]:
    process = subprocess.Popen(["sleep", "30"])
    identity = identify(process.pid)
    assert identity is not None
    yield identity
    process.kill()
    process.wait()


def request(
    kernel_id: str,
    size: str,
    *,
    placement: str = "shared",
    mode: str = "timeslice",
    owner: str = "alice",
    holder: ProcessIdentity = ME,
) -> NewRequest:
    return NewRequest(
        kernel_id=kernel_id,
        owner=owner,
        server_id="server-1",
        mode=mode,
        placement=placement,  # type: ignore[arg-type]
        size=size,
        cores=None,
        holder=holder,
        kernel_name="python3-gpu-4g",
        path=f"{kernel_id}.ipynb",
    )


def place(ledger: Ledger, kernel_id: str, size: str, **options: object) -> SliceRecord:
    ledger.enqueue(request(kernel_id, size, **options))  # type: ignore[arg-type]
    outcome = ledger.try_place(kernel_id, Policy())
    assert isinstance(outcome, Placed), outcome
    return outcome.record


def reserved_on(ledger: Ledger, device_uuid: str) -> int:
    return sum(r.memory for r in ledger.records() if r.state == "running" and r.device_uuid == device_uuid)


# ---- enqueue / place / release ------------------------------------------------------------------


def test_a_request_placed_at_once_is_the_row_the_ledger_holds(ledger: Ledger) -> None:
    """The common start is written straight as a running slice: what it answers is what is stored,
    and the accounting has its one placement."""
    outcome = ledger.request(request("k1", "4G"), Policy())
    assert isinstance(outcome, Placed), outcome
    [stored] = ledger.records()
    assert outcome.record == stored
    assert stored.state == "running" and stored.memory == 4 * GiB and stored.device_uuid == T4.uuid
    assert stored.placed_at is not None and stored.placed_at >= stored.requested_at
    events = ledger.read_with(
        lambda db: db.execute(
            "SELECT what, memory, requested_at FROM acct_events WHERE kernel_id = 'k1'"
        ).fetchall()
    )
    assert [tuple(event) for event in events] == [("placed", 4 * GiB, stored.requested_at)]


def test_a_request_that_fits_still_waits_behind_a_queued_one(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "one-card.sqlite")
    ledger.register_devices(parse_simulation("1xT4-16GB").devices, simulated=True)
    try:
        assert isinstance(ledger.request(request("holder", "12G"), Policy()), Placed)
        assert isinstance(ledger.request(request("large", "8G"), Policy()), Waiting)
        small = ledger.request(request("small", "2G"), Policy())
        assert isinstance(small, Waiting) and small.position == 2, small
        assert {r.kernel_id: r.state for r in ledger.records()} == {
            "holder": "running",
            "large": "queued",
            "small": "queued",
        }
        # A kernel that has a row already (a restart) keeps it.
        again = ledger.request(request("holder", "12G"), Policy())
        assert isinstance(again, Placed) and again.record == ledger.records()[0]
    finally:
        ledger.close()


def test_enqueue_then_place_then_release(ledger: Ledger) -> None:
    queued = ledger.enqueue(request("k1", "4G"))
    assert queued.state == "queued"
    assert queued.device_uuid is None
    assert queued.memory == 0
    assert ledger.queue_position("k1") == 1

    outcome = ledger.try_place("k1", Policy())
    assert isinstance(outcome, Placed)
    record = outcome.record
    assert record.state == "running"
    assert record.device_uuid == T4.uuid == record.unit_uuid
    assert record.memory == 4 * GiB
    assert record.placed_at is not None and record.placed_at >= record.requested_at
    assert ledger.queue_position("k1") is None
    assert ledger.get("k1") == record
    # Placing again answers the same placement; nothing is booked twice.
    assert ledger.try_place("k1", Policy()) == Placed(record)
    assert reserved_on(ledger, T4.uuid) == 4 * GiB

    released = ledger.release("k1")
    assert released is not None and released.kernel_id == "k1"
    assert ledger.get("k1") is None
    assert ledger.records() == []
    assert ledger.release("k1") is None


def test_the_request_fields_are_recorded(ledger: Ledger) -> None:
    record = place(ledger, "k1", "25%", owner="bob")
    assert (record.owner, record.server_id, record.kernel_name, record.path) == (
        "bob",
        "server-1",
        "python3-gpu-4g",
        "k1.ipynb",
    )
    assert (record.mode, record.placement, record.size) == ("timeslice", "shared", "25%")
    assert record.memory == 4 * GiB  # 25% of the 16G card it landed on
    assert record.holder == ME
    assert record.kernel is None
    assert record.process == ME


def test_try_place_for_an_unknown_kernel(ledger: Ledger) -> None:
    with pytest.raises(LookupError):
        ledger.try_place("nobody", Policy())


def test_enqueue_of_a_kernel_that_already_holds_a_slice_keeps_it(ledger: Ledger, live_process) -> None:
    first = place(ledger, "k1", "4G")
    again = ledger.enqueue(request("k1", "8G", holder=live_process))
    assert again.state == "running"
    assert again.memory == first.memory
    assert again.seq == first.seq
    assert again.holder == live_process


def test_placement_does_not_exceed_capacity(ledger: Ledger) -> None:
    place(ledger, "a", "10G")
    ledger.enqueue(request("b", "10G"))
    outcome = ledger.try_place("b", Policy())
    assert isinstance(outcome, Waiting)
    assert outcome.position == 1
    assert "free on GPU0" in outcome.reason  # 6G on the T4, everything on the A100 is MIG
    assert reserved_on(ledger, T4.uuid) == 10 * GiB


def test_a_request_that_can_never_fit_is_refused(ledger: Ledger) -> None:
    ledger.enqueue(request("k1", "100G"))
    outcome = ledger.try_place("k1", Policy())
    assert isinstance(outcome, Refused)
    assert "larger than any GPU" in outcome.reason
    assert ledger.get("k1").state == "queued"  # the caller withdraws it


def test_mig_slices_take_an_instance(ledger: Ledger) -> None:
    first = place(ledger, "m1", "5G", placement="mig", mode="mig")
    second = place(ledger, "m2", "5G", placement="mig", mode="mig")
    third = place(ledger, "m3", "5G", placement="mig", mode="mig")
    units = {first.unit_uuid, second.unit_uuid, third.unit_uuid}
    assert units == {instance.uuid for instance in POOL.devices[1].mig}
    ledger.enqueue(request("m4", "5G", placement="mig", mode="mig"))
    outcome = ledger.try_place("m4", Policy())
    assert isinstance(outcome, Waiting) and "in use" in outcome.reason


# ---- strict FIFO --------------------------------------------------------------------------------


def test_fifo_a_later_request_waits_behind_an_earlier_one_even_if_it_fits(ledger: Ledger) -> None:
    place(ledger, "a", "12G")
    ledger.enqueue(request("big", "8G"))
    ledger.enqueue(request("small", "1G"))
    big = ledger.try_place("big", Policy())
    assert isinstance(big, Waiting) and big.position == 1
    small = ledger.try_place("small", Policy())
    assert isinstance(small, Waiting)
    assert small.position == 2
    assert ledger.queue_position("small") == 2
    assert "behind 1 earlier" in small.reason
    assert ledger.get("small").state == "queued"
    # When the memory comes back, the first in line goes first, then the next.
    ledger.release("a")
    assert ledger.try_place("small", Policy()) == Waiting(2, small.reason)
    assert isinstance(ledger.try_place("big", Policy()), Placed)
    assert isinstance(ledger.try_place("small", Policy()), Placed)


def test_fifo_skips_an_earlier_waiter_whose_process_is_gone(ledger: Ledger, dead_process) -> None:
    ledger.enqueue(request("ghost", "8G", holder=dead_process))
    ledger.enqueue(request("next", "8G"))
    outcome = ledger.try_place("next", Policy())
    assert isinstance(outcome, Placed)
    assert ledger.get("ghost") is None


def test_a_waiter_first_in_line_frees_memory_of_dead_slices(ledger: Ledger, dead_process) -> None:
    place(ledger, "crashed", "12G", holder=dead_process)
    outcome = ledger.enqueue(request("k1", "8G"))
    assert outcome.state == "queued"
    placed = ledger.try_place("k1", Policy())
    assert isinstance(placed, Placed)
    assert ledger.get("crashed") is None
    assert reserved_on(ledger, T4.uuid) == 8 * GiB


# ---- liveness and reconciliation -----------------------------------------------------------------


def test_reconcile_releases_the_slice_of_a_kernel_that_died(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    kernel = subprocess.Popen(["sleep", "30"])
    try:
        identity = identify(kernel.pid)
        assert identity is not None
        ledger.attach_kernel("k1", identity)
        assert ledger.get("k1").kernel == identity
        assert ledger.reconcile() == []  # alive: kept
        assert ledger.get("k1") is not None
    finally:
        kernel.kill()
        kernel.wait()
    released = ledger.reconcile()
    assert [record.kernel_id for record in released] == ["k1"]
    assert ledger.get("k1") is None
    assert reserved_on(ledger, T4.uuid) == 0


def test_reconcile_releases_a_zombie_kernel(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    kernel = subprocess.Popen(["sleep", "30"])
    identity = identify(kernel.pid)
    assert identity is not None
    ledger.attach_kernel("k1", identity)
    kernel.kill()
    # Wait until it has exited, without reaping it: a zombie keeps its pid and start time.
    os.waitid(os.P_PID, kernel.pid, os.WEXITED | os.WNOWAIT)
    try:
        assert [record.kernel_id for record in ledger.reconcile()] == ["k1"]
    finally:
        kernel.wait()


def test_a_reused_pid_does_not_keep_a_dead_slice(ledger: Ledger) -> None:
    impostor = ProcessIdentity(os.getpid(), ME.start - 1000)  # this pid, another start time
    assert not is_alive(impostor)
    place(ledger, "k1", "4G")
    ledger.attach_kernel("k1", impostor)
    place(ledger, "k2", "4G")
    assert [record.kernel_id for record in ledger.reconcile()] == ["k1"]
    assert ledger.get("k2") is not None


def test_detaching_the_kernel_gives_the_slice_back_to_the_holder(ledger: Ledger, dead_process) -> None:
    place(ledger, "k1", "4G")
    ledger.attach_kernel("k1", dead_process)
    ledger.attach_kernel("k1", None)  # a restart: the holder (this process) keeps it
    assert ledger.get("k1").process == ME
    assert ledger.reconcile() == []


def test_reconcile_also_withdraws_queued_requests_of_dead_holders(ledger: Ledger, dead_process) -> None:
    ledger.enqueue(request("ghost", "4G", holder=dead_process))
    ledger.enqueue(request("alive", "4G"))
    assert [record.kernel_id for record in ledger.reconcile()] == ["ghost"]
    assert [record.kernel_id for record in ledger.records()] == ["alive"]


def test_liveness_with_a_custom_check(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    place(ledger, "k2", "4G")
    gone = ledger.reconcile(alive=lambda identity: False)
    assert sorted(record.kernel_id for record in gone) == ["k1", "k2"]


@pytest.mark.parametrize("pid", [2**22 + 12345, 999_999_999])
def test_identify_a_pid_that_does_not_exist(pid: int) -> None:
    assert identify(pid) is None
    assert not is_alive(ProcessIdentity(pid, 0.0))


def test_this_process_is_alive() -> None:
    assert is_alive(current_process())
    assert current_process().pid == os.getpid()


# ---- resize ------------------------------------------------------------------------------------


def test_resize_grows_in_place_when_it_fits(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    place(ledger, "k2", "4G")
    outcome = ledger.resize("k1", "12G", Policy())
    assert isinstance(outcome, Spot)
    assert outcome.memory == 12 * GiB
    record = ledger.get("k1")
    assert (record.memory, record.size, record.device_uuid) == (12 * GiB, "12G", T4.uuid)
    assert reserved_on(ledger, T4.uuid) == 16 * GiB


def test_resize_that_does_not_fit_says_how_much_is_free_and_changes_nothing(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    place(ledger, "k2", "8.5G")
    outcome = ledger.resize("k1", "12G", Policy())
    assert isinstance(outcome, NoFit)
    assert "12G does not fit" in outcome.reason
    assert "3.5G free on GPU0, so this kernel can grow to 7.5G" in outcome.reason
    record = ledger.get("k1")
    assert (record.memory, record.size) == (4 * GiB, "4G")


def test_resize_shrinks(ledger: Ledger) -> None:
    place(ledger, "k1", "8G")
    outcome = ledger.resize("k1", "512M", Policy())
    assert isinstance(outcome, Spot) and outcome.memory == 512 * MiB
    assert reserved_on(ledger, T4.uuid) == 512 * MiB


def test_resize_respects_overcommit(ledger: Ledger) -> None:
    place(ledger, "k1", "8G")
    place(ledger, "k2", "8G")
    assert isinstance(ledger.resize("k1", "10G", Policy()), NoFit)
    assert isinstance(ledger.resize("k1", "10G", Policy(overcommit=1.5)), Spot)


@pytest.mark.parametrize(
    ("placement", "mode", "size"), [("exclusive", "exclusive", "whole"), ("mig", "mig", "5G")]
)
def test_resize_is_refused_for_whole_cards_and_mig(
    ledger: Ledger, placement: str, mode: str, size: str
) -> None:
    before = place(ledger, "k1", size, placement=placement, mode=mode)
    outcome = ledger.resize("k1", "2G", Policy())
    assert isinstance(outcome, NoFit)
    assert not outcome.retry
    assert mode in outcome.reason
    assert ledger.get("k1") == before


def test_resize_of_a_kernel_without_a_slice(ledger: Ledger) -> None:
    assert isinstance(ledger.resize("nobody", "2G", Policy()), NoFit)
    ledger.enqueue(request("queued", "2G"))
    assert isinstance(ledger.resize("queued", "2G", Policy()), NoFit)


# ---- devices and durability ---------------------------------------------------------------------


def test_register_devices_is_idempotent_and_replaces_a_changed_pool(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.devices() == []
    ledger.register_devices(POOL.devices, simulated=True)
    ledger.register_devices(POOL.devices, simulated=True)
    assert ledger.devices() == list(POOL.devices)
    assert ledger.simulated()
    other = parse_simulation("1xH100-80GB").devices
    ledger.register_devices(other, simulated=False)
    assert ledger.devices() == list(other)
    assert not ledger.simulated()


def test_records_survive_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "ledger.sqlite"
    first = Ledger(path)
    first.register_devices(POOL.devices, simulated=True)
    place(first, "k1", "4G")
    first.enqueue(request("k2", "100G"))
    before = first.records()
    first.close()
    reopened = Ledger(path)
    assert reopened.records() == before
    assert reopened.devices() == list(POOL.devices)
    assert reopened.queue_position("k2") == 1
    reopened.close()


def test_two_ledger_objects_on_one_file_see_each_other(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    one, two = Ledger(path), Ledger(path)
    one.register_devices(POOL.devices, simulated=True)
    place(one, "k1", "10G")
    two.enqueue(request("k2", "10G"))
    outcome = two.try_place("k2", Policy())
    assert isinstance(outcome, Waiting)


# ---- across processes ---------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, sys
    from jupyter_gpushare.core.placement.allocator import Policy
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.core.records import NewRequest, Placed
    from jupyter_gpushare.core.records import ProcessIdentity

    path, name, holder_pid, holder_start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ledger = Ledger(path)
    holder = ProcessIdentity(holder_pid, holder_start)
    placed = []
    for number in range(8):
        kernel_id = f"{name}-{number}"
        ledger.enqueue(NewRequest(kernel_id, name, "s", "timeslice", "shared", "3G", None, holder))
        if isinstance(ledger.try_place(kernel_id, Policy()), Placed):
            placed.append(kernel_id)
        else:
            ledger.release(kernel_id)  # when_full = "fail": withdraw
    print(json.dumps(placed))
    """
)


def test_processes_racing_on_one_ledger_never_overbook(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.register_devices(parse_simulation("1xT4-16GB").devices, simulated=True)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), f"w{number}", str(ME.pid), repr(ME.start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for number in range(4)
    ]
    placed = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        placed.extend(json.loads(out))
    records = ledger.records()
    assert sorted(record.kernel_id for record in records) == sorted(placed)
    assert all(record.state == "running" for record in records)
    assert 1 <= len(records) <= 5  # 5 x 3G fit in 16G
    assert sum(record.memory for record in records) <= 16 * GiB


# A ledger file as the first release wrote it (schema version 1): a server upgraded while kernels
# of the old release still hold slices must read them, place around them and release them.
SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE devices (
    uuid TEXT PRIMARY KEY, idx INTEGER NOT NULL, name TEXT NOT NULL, memory_total INTEGER NOT NULL,
    mig TEXT NOT NULL, simulated INTEGER NOT NULL
);
CREATE TABLE slices (
    kernel_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running')),
    owner TEXT NOT NULL, server_id TEXT NOT NULL, kernel_name TEXT NOT NULL DEFAULT '',
    path TEXT NOT NULL DEFAULT '', mode TEXT NOT NULL, kind TEXT NOT NULL, size TEXT NOT NULL,
    cores INTEGER, device_uuid TEXT, unit_uuid TEXT, memory INTEGER NOT NULL DEFAULT 0,
    whole_card INTEGER NOT NULL DEFAULT 0, holder_pid INTEGER NOT NULL, holder_start REAL NOT NULL,
    kernel_pid INTEGER, kernel_start REAL, requested_at REAL NOT NULL, placed_at REAL
);
CREATE INDEX slices_by_state ON slices (state, seq);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def test_a_ledger_file_of_the_first_release_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_V1)
    old.execute("INSERT INTO devices VALUES (?, 0, ?, ?, '[]', 1)", (T4.uuid, T4.name, T4.memory_total))
    old.execute(
        """INSERT INTO slices (kernel_id, seq, state, owner, server_id, mode, kind, size, device_uuid,
           unit_uuid, memory, holder_pid, holder_start, requested_at, placed_at)
           VALUES ('old', 1, 'running', 'alice', 's', 'timeslice', 'shared', '10G', ?, ?, ?, ?, ?, 0, 0)""",
        (T4.uuid, T4.uuid, 10 * GiB, ME.pid, ME.start),
    )
    old.commit()
    old.close()

    ledger = Ledger(path)
    (record,) = ledger.records()
    assert (record.kernel_id, record.memory, record.holder) == ("old", 10 * GiB, ME)
    ledger.enqueue(request("new", "8G"))
    waiting = ledger.try_place("new", Policy())
    assert isinstance(waiting, Waiting)  # the old slice still counts
    assert "6G free on GPU0" in waiting.reason
    ledger.release("old")
    assert isinstance(ledger.try_place("new", Policy()), Placed)
    ledger.close()


def test_a_sampling_round_that_changes_nothing_leaves_the_ledger_unchanged(ledger: Ledger) -> None:
    """Readers cache on the ledger's change marker; a steady kernel must not invalidate them."""
    record = place(ledger, "k-1", "4G")
    device = DeviceSample(str(record.device_uuid), 2 * GiB, 30)
    sample = KernelSample("k-1", 1 * GiB, 20, "nvml", ("near its slice",))
    ledger.record_usage([sample], [device])
    before = ledger.change_marker()
    ledger.record_usage([sample], [device])
    ledger.record_usage([KernelSample("k-1", None, None, None, ("near its slice",))])
    assert ledger.change_marker() == before
    ledger.record_usage([KernelSample("k-1", 1 * GiB, 21, "nvml", ("near its slice",))], [device])
    assert ledger.change_marker() != before
    assert ledger.get("k-1").utilization == 21  # type: ignore[union-attr]
    changed = ledger.change_marker()
    ledger.record_usage([], [DeviceSample(device.uuid, 3 * GiB, 30)])
    assert ledger.change_marker() != changed
    assert {d.uuid: d.memory_used for d in ledger.devices()}[device.uuid] == 3 * GiB


# ---- what a released kernel leaves behind (issue 11) --------------------------------------------


def test_a_released_slice_keeps_its_kernels_token_name_and_path(ledger: Ledger, live_process) -> None:
    kernel = dataclasses.replace(request("k1", "4G", holder=live_process), token_hash="digest")
    ledger.enqueue(kernel)
    assert isinstance(ledger.try_place("k1", Policy()), Placed)
    ledger.release("k1", keep_claim=True)
    left = ledger.released("k1")
    assert left is not None
    assert (left.token_hash, left.kernel_name, left.path, left.process) == (
        "digest",
        "python3-gpu-4g",
        "k1.ipynb",
        live_process,
    )
    # A request under the id without a name or path takes them back; the memory is spent.
    ledger.enqueue(dataclasses.replace(kernel, kernel_name="", path=""))
    record = ledger.get("k1")
    assert record is not None and (record.kernel_name, record.path) == ("python3-gpu-4g", "k1.ipynb")
    assert ledger.released("k1") is None


def test_what_a_kernel_left_goes_when_it_ends(ledger: Ledger, dead_process: ProcessIdentity) -> None:
    place(ledger, "k1", "4G")
    ledger.release("k1", keep_claim=True)
    ledger.release("k1")  # the kernel shuts down: its claim goes with it
    assert ledger.released("k1") is None
    place(ledger, "k2", "4G", holder=dead_process)
    ledger.attach_kernel("k2", None)
    ledger.release("k2", keep_claim=True)
    assert ledger.released("k2") is not None
    ledger.reconcile()  # its process is gone
    assert ledger.released("k2") is None


def test_sizes_are_stored_in_their_canonical_spelling(ledger: Ledger) -> None:
    place(ledger, "k1", "4G")
    ledger.resize("k1", "3072MiB", Policy())
    record = ledger.get("k1")
    assert record is not None and (record.size, record.memory) == ("3G", 3 * GiB)


def test_a_ledger_opened_after_a_restart_forgets_the_earlier_boots_processes(tmp_path: Path) -> None:
    """Pids and starts count from boot, so a process after a restart can carry the identity of
    one that held a slice (here: this very process stands for that stranger). Failed before: the
    slice stayed held for as long as the stranger ran."""
    path = tmp_path / "ledger.sqlite"
    before = Ledger(path)
    before.register_devices(POOL.devices, simulated=True)
    place(before, "k1", "4G")
    place(before, "k2", "4G", holder=ME)
    before.release("k2", keep_claim=True)  # a released kernel's claim goes with its boot too
    assert before.read_with(lambda db: db.execute("SELECT COUNT(*) FROM released").fetchone()[0]) == 1
    before.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'boot_id'").fetchone()[0] == boot_id()
        db.execute("UPDATE meta SET value = 'the-boot-before' WHERE key = 'boot_id'")
    db.close()

    after = Ledger(path)
    try:
        assert after.records() == []
        assert after.read_with(lambda db: db.execute("SELECT COUNT(*) FROM released").fetchone()[0]) == 0
        assert (
            after.read_with(
                lambda db: db.execute("SELECT value FROM meta WHERE key = 'boot_id'").fetchone()[0]
            )
            == boot_id()
        )
        place(after, "k3", "4G")  # and the ledger goes on as usual
    finally:
        after.close()


def test_a_ledger_opened_again_in_the_same_boot_keeps_its_slices(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    before = Ledger(path)
    before.register_devices(POOL.devices, simulated=True)
    place(before, "k1", "4G")
    before.close()
    again = Ledger(path)
    try:
        assert [record.kernel_id for record in again.records()] == ["k1"]
    finally:
        again.close()
