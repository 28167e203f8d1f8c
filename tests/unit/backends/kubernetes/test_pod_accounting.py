"""The Kubernetes broker's accounting: what a look at the pods shows (pure), what changed since the
last, and the figures its file folds them into (a real sqlite file, the accounting's own triggers)."""

from __future__ import annotations

import datetime
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from jupyter_gpushare.backends.kubernetes.broker.pod_accounting import PodAccounting
from jupyter_gpushare.backends.kubernetes.objects.accounted import Accounted, Waiting, accounted, changes
from jupyter_gpushare.backends.kubernetes.objects.pool import read_pod
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import LedgerError
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.core.sizes import GiB
from jupyter_gpushare.core.visibility import EVERYONE

from .test_pool import pod

HOUR = 3600.0


def slices(*pods: dict) -> list:
    return [item for item in map(read_pod, pods) if item is not None]


# ---- a look (pure) --------------------------------------------------------------------------------


def test_a_bound_pod_is_held_an_unbound_one_and_a_queued_start_wait() -> None:
    seen = accounted(
        slices(
            pod("k1", owner="alice", memory="6G", node_name="gpu-1", phase="Pending"),
            pod("k2", owner="bob", memory="2G", node_name=None, phase="Pending"),
        ),
        [Waiting("k3", "carol", 4 * GiB, 1000.0)],
        {"k1": UsageReport(GiB, None, "kernel"), "k2": UsageReport(GiB, None, "kernel")},
        {"k1": 900.0},
    )
    assert seen["k1"] == Accounted("k1", "alice", "running", 6 * GiB, GiB, 900.0)
    # Not placed: no use counted, and its wait began when its pod was made (no start known).
    assert seen["k2"].state == "queued" and seen["k2"].used is None
    assert (
        seen["k2"].requested_at
        == datetime.datetime(2026, 11, 29, 10, tzinfo=datetime.timezone.utc).timestamp()
    )
    assert seen["k3"] == Accounted("k3", "carol", "queued", 4 * GiB, None, 1000.0)
    # Found running, its start unknown (made before the broker started): no wait is made up.
    [found] = accounted(slices(pod("k4", node_name="gpu-1")), [], {}, {}).values()
    assert found.state == "running" and found.requested_at is None


def test_an_ended_or_deleted_pod_holds_nothing() -> None:
    done = pod("k1", phase="Succeeded")
    deleting = pod("k2")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T10:05:00Z"
    assert accounted(slices(done, deleting), [], {}, {}) == {}


def test_changes_say_what_to_write() -> None:
    queued = Accounted("k1", "alice", "queued", 6 * GiB, None, 1.0)
    held = Accounted("k1", "alice", "running", 6 * GiB, None, 1.0)
    assert not changes({"k1": queued}, {"k1": queued})
    assert changes({}, {"k1": queued}).added == [queued]
    assert changes({"k1": queued}, {"k1": held}).placed == [held]
    using = Accounted("k1", "alice", "running", 6 * GiB, GiB, 1.0)
    assert changes({"k1": held}, {"k1": using}).used == [using]
    # No report this time: what was last reported stands (no change written).
    assert not changes({"k1": using}, {"k1": held})
    bigger = Accounted("k1", "alice", "running", 8 * GiB, GiB, 1.0)
    assert changes({"k1": using}, {"k1": bigger}).resized == [bigger]
    assert changes({"k1": held}, {}).gone == ["k1"]
    # A restarted kernel waits for its new pod: the hold ends, a new wait begins.
    again = changes({"k1": held}, {"k1": queued})
    assert again.gone == ["k1"] and again.added == [queued]


# ---- the file -------------------------------------------------------------------------------------


def accounting(path: Path) -> PodAccounting:
    return PodAccounting(path, lambda: GPUShare())


def test_a_hold_is_accounted_from_its_placement_to_its_end_with_its_wait_and_use(tmp_path: Path) -> None:
    file = accounting(tmp_path / "accounting.sqlite")
    asked = time.time()
    queued = Accounted("k1", "alice", "queued", 6 * GiB, None, asked)
    assert file.look(lambda: {"k1": queued}) == 1
    held = Accounted("k1", "alice", "running", 6 * GiB, None, asked)
    # Each moment the file notes lies within the look that wrote it: bounds taken around each look
    # (a write on a loaded machine can take a good part of a second).
    placed = time.time()
    assert file.look(lambda: {"k1": held}) == 1
    placed_by = time.time()
    assert file.look(lambda: {"k1": held}) == 0  # nothing changed: nothing written
    used = time.time()
    file.look(lambda: {"k1": Accounted("k1", "alice", "running", 6 * GiB, 2 * GiB, asked)})
    used_by = time.time()
    time.sleep(1.0)
    ending = time.time()
    file.look(dict)  # the pod went
    ended = time.time()
    [row] = file.report(HOUR, "kernel", EVERYONE)["rows"]
    slack = 0.02  # the file's clock and ours are read a little apart
    assert row["owner"] == "alice" and row["starts"] == 1
    reserved = row["reserved_gib_hours"] * HOUR / 6
    assert ending - placed_by - slack <= reserved <= ended - placed + slack
    used_for = row["used_gib_hours"] * HOUR / 2
    assert ending - used_by - slack <= used_for <= ended - used + slack
    assert placed - asked - slack <= row["mean_start_wait_seconds"] <= placed_by - asked + slack
    # A hold's end is known: the wait estimates' history has it.
    assert [memory for memory, _ in file.history().holds] == [6 * GiB]


def test_each_user_sees_their_own_figures_an_admin_everyones(tmp_path: Path) -> None:
    file = accounting(tmp_path / "accounting.sqlite")
    now = time.time()
    file.look(
        lambda: {
            "a1": Accounted("a1", "alice", "running", 2 * GiB, None, now),
            "b1": Accounted("b1", "bob", "running", 4 * GiB, None, now),
        }
    )
    time.sleep(0.2)
    assert [row["key"] for row in file.report(HOUR, "user", "alice")["rows"]] == ["alice"]
    assert "b1" not in str(file.report(HOUR, "kernel", "alice"))
    assert {row["key"] for row in file.report(HOUR, "user", EVERYONE)["rows"]} == {"alice", "bob"}
    assert [row["key"] for row in file.total_rows("bob")] == ["bob"]
    file.note_groups("bob", ["ml"])
    assert {row["key"] for row in file.report(HOUR, "group", EVERYONE)["rows"]} == {"(no group)", "ml"}


def test_a_restarted_broker_goes_on_with_the_holds_it_found(tmp_path: Path) -> None:
    path = tmp_path / "accounting.sqlite"
    now = time.time()
    held = {"k1": Accounted("k1", "alice", "running", 6 * GiB, None, now)}
    accounting(path).look(lambda: held)
    again = accounting(path)
    assert again.look(lambda: held) == 0  # the same hold, not a second start
    again.look(dict)
    [row] = again.report(HOUR, "kernel", EVERYONE)["rows"]
    assert row["starts"] == 1


def test_the_file_is_the_brokers_alone_and_a_node_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broker" / "accounting.sqlite"
    accounting(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ledger = tmp_path / "ledger.sqlite"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE slices (kernel_id TEXT PRIMARY KEY, device_uuid TEXT)")
    with pytest.raises(LedgerError, match=r"ledger\.sqlite: it is not a GPU broker's accounting file"):
        accounting(ledger)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerError, match=r"garbage\.sqlite"):
        accounting(garbage)


def test_a_cells_report_before_the_round_finds_its_hold(tmp_path: Path) -> None:
    """A kernel's first cell may come before the broker's next round has seen its pod placed:
    the report writes that kernel's placement first (as the broker sees it now), so the cell
    counts as busy time of its hold."""
    file = accounting(tmp_path / "accounting.sqlite")
    asked = time.time()
    file.look(lambda: {"k1": Accounted("k1", "alice", "queued", GiB, None, asked)})
    held = Accounted("k1", "alice", "running", GiB, None, asked)
    file.seen_one = lambda kernel_id: held if kernel_id == "k1" else None
    assert file.note_activity("k1", True, time.time(), 0, "release")
    time.sleep(0.5)
    assert file.note_activity("k1", False, time.time(), 0, "release")
    [row] = file.report(HOUR, "kernel", EVERYONE)["rows"]
    assert row["starts"] == 1
    assert row["busy_hours"] * HOUR == pytest.approx(0.5, abs=0.2)
    assert file.look(lambda: {"k1": held}) == 0  # the round finds it written already
