"""One read of the ledger per change, shared by every reader of the process (issue 24).

The views, the stream and the sampler read the whole ledger on every request or tick; they share
``Ledger.state()`` until the next commit, and a read after a commit turns only changed rows
into records. Stale is never an option: any commit a view could show, by any connection or
process, renews it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.local.ledger.access import LedgerAccess
from jupyter_gpushare.backends.local.ledger.connections import ThreadConnections
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed

POOL = parse_simulation("2xA100-80GB")
ME = current_process()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_devices(POOL.devices, simulated=True)
    for index in range(5):
        kernel_id = f"k-{index}"
        placed = ledger.request(
            NewRequest(kernel_id, "alice", "s", "timeslice", "shared", "2G", None, ME), Policy()
        )
        assert isinstance(placed, Placed)
        ledger.report_usage(kernel_id, (index + 1) * 2**20, 10, "simulated")
    yield ledger
    ledger.close()


def test_the_state_is_read_once_and_shared_until_a_commit(ledger: Ledger) -> None:
    state = ledger.state()
    assert ledger.state() is state, "no commit: the same state, not a second read"
    assert [record.kernel_id for record in state.slices] == [f"k-{index}" for index in range(5)]
    assert state.slices == tuple(ledger.records())
    assert [device.uuid for device in state.devices] == [device.uuid for device in POOL.devices]
    assert state.simulated and state.released == ()

    ledger.report_usage("k-1", 7 * 2**20, 20, "simulated")  # this process's own commit
    renewed = ledger.state()
    assert renewed is not state
    assert {record.kernel_id: record.memory_used for record in renewed.slices}["k-1"] == 7 * 2**20


def test_a_commit_by_another_process_renews_the_state(ledger: Ledger) -> None:
    state = ledger.state()
    script = textwrap.dedent(
        f"""
        from jupyter_gpushare.backends.local.ledger import Ledger
        ledger = Ledger({str(ledger.path)!r})
        ledger.release("k-3")
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    renewed = ledger.state()
    assert "k-3" in {record.kernel_id for record in state.slices}
    assert "k-3" not in {record.kernel_id for record in renewed.slices}


def test_a_row_that_did_not_change_keeps_its_record(ledger: Ledger) -> None:
    before = {record.kernel_id: record for record in ledger.state().slices}
    ledger.report_usage("k-2", 9 * 2**20, 30, "simulated")
    after = {record.kernel_id: record for record in ledger.state().slices}
    assert all(after[kernel_id] is before[kernel_id] for kernel_id in before if kernel_id != "k-2")
    assert after["k-2"] is not before["k-2"]
    assert (after["k-2"].memory_used, after["k-2"].utilization) == (9 * 2**20, 30)
    assert after["k-2"] == ledger.get("k-2")


def test_the_change_marker_does_not_repeat_when_its_connection_is_replaced(ledger: Ledger) -> None:
    """sqlite's ``data_version`` counts from its own connection's start; the marker is the views'
    version kept in the file, so a new watching connection (after an error drops the
    connections) reads the same marker, and never an earlier one for a later state."""
    access = LedgerAccess(ledger.path, lambda row: True)
    seen = [access.change_marker()]
    for index in range(3):
        ledger.report_usage("k-0", index * 2**20, 10, "simulated")  # another connection commits
        marker = access.change_marker()
        assert marker not in seen
        seen.append(marker)
        access.forget_thread_connections()  # what an sqlite error does
        assert access.change_marker() == marker, "nothing changed: the same marker"
    access.close()


def test_each_watching_connection_reads_the_views_version_again(tmp_path: Path) -> None:
    Ledger(tmp_path / "ledger.sqlite").register_devices(POOL.devices, simulated=True)
    threads = ThreadConnections(tmp_path / "ledger.sqlite", 5.0)
    first = threads.view_version(1)
    assert first is not None and first > 0, "registering the devices counted"
    assert threads.view_version(1) == first
    threads.forget()
    assert threads.view_version(1) == first, "a fresh connection reads the same version"
    assert threads.view_version(2) == first, "so does the one a new file generation opens"
    threads.close()


def test_the_marker_told_at_once_agrees_with_the_waiting_one_and_moves_with_every_commit(
    ledger: Ledger,
) -> None:
    """What an event loop reads without a thread hop is the marker a worker thread reads, and it
    moves with a commit of this process's and with one of another process's."""
    first = ledger.change_marker()
    assert ledger.change_marker_at_once() == first
    ledger.report_usage("k-0", 3 * 2**20, 10, "simulated")
    second = ledger.change_marker_at_once()
    assert second not in (None, first) and second == ledger.change_marker()
    script = (
        "from jupyter_gpushare.backends.local.ledger import Ledger; "
        f"Ledger({str(ledger.path)!r}).release('k-3')"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    third = ledger.change_marker_at_once()
    assert third not in (None, first, second) and third == ledger.change_marker()


def test_the_marker_is_not_told_at_once_where_telling_it_means_opening_or_mending_the_file(
    tmp_path: Path,
) -> None:
    """Opening the file, or putting back a deleted one, is a waiting read's work (a worker
    thread's): the read at once says None and leaves the file alone."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.change_marker_at_once() is None
    assert not ledger.path.exists(), "the read at once created nothing"
    ledger.register_devices(POOL.devices, simulated=True)
    marker = ledger.change_marker()
    assert ledger.change_marker_at_once() == marker
    ledger.path.unlink()
    assert ledger.change_marker_at_once() is None
    assert not ledger.path.exists(), "the read at once put nothing back"
    restored = ledger.change_marker()
    assert ledger.path.exists() and ledger.change_marker_at_once() == restored != marker
    ledger.close()


def test_a_watching_connection_not_yet_opened_is_not_opened_by_a_read_at_once(tmp_path: Path) -> None:
    Ledger(tmp_path / "ledger.sqlite").register_devices(POOL.devices, simulated=True)
    threads = ThreadConnections(tmp_path / "ledger.sqlite", 5.0)
    assert threads.view_version(1, wait=False) is None
    counted = threads.view_version(1)
    assert threads.view_version(1, wait=False) == counted
    assert threads.view_version(2, wait=False) is None, "another file generation: a new connection"
    threads.close()
