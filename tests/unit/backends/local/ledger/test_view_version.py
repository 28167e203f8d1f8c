"""The change marker moves with what the views show, not with the accounting's fold (issue 40).

The fold commits a second or so after every start and end (the usage monitor's round, the
broker's housekeeping); it writes figures no view of the pool or of the kernels shows, so the
readers' caches and every stream stay as they were. What a view does show — a slice, a
kernel's report of its cells, and while a request waits the figures its order and expected
start go by — still moves the marker, by any process.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.accounts import LedgerAccounts
from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed, Waiting

POOL = parse_simulation("1xA100-80GB")
ME = current_process()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_devices(POOL.devices, simulated=True)
    yield ledger
    ledger.close()


@pytest.fixture
def accounts(ledger: Ledger) -> LedgerAccounts:
    return LedgerAccounts(ledger, lambda: GPUShare())


def start(ledger: Ledger, kernel_id: str, size: str = "4G") -> None:
    request = NewRequest(kernel_id, "alice", "s", "timeslice", "shared", size, None, ME, "python3", "a.ipynb")
    assert isinstance(ledger.request(request, Policy()), Placed)


def data_version(watcher: sqlite3.Connection) -> int:
    """sqlite's count of commits, as a connection of the test's own sees it."""
    return int(watcher.execute("PRAGMA data_version").fetchone()[0])


def views_version(ledger: Ledger) -> int:
    return int(ledger.read_with(lambda db: db.execute("SELECT version FROM view_version").fetchone()[0]))


def test_the_accounting_fold_commits_but_moves_no_marker(ledger: Ledger, accounts: LedgerAccounts) -> None:
    watcher = sqlite3.connect(ledger.path)
    before = ledger.change_marker()
    start(ledger, "k1")
    started = ledger.change_marker()
    assert started != before, "a start moves the marker"
    state = ledger.state()
    committed = data_version(watcher)

    assert accounts.fold() == 1  # the start's event, folded in a commit of its own
    assert data_version(watcher) != committed, "the fold did commit"
    assert ledger.change_marker() == started
    assert ledger.change_marker_at_once() == started
    assert ledger.state() is state, "the readers' state is still current"

    assert ledger.release("k1") is not None
    ended = ledger.change_marker()
    assert ended != started, "an end moves the marker"
    assert accounts.fold() == 1
    assert ledger.change_marker_at_once() == ledger.change_marker() == ended
    watcher.close()


def test_a_fold_by_another_process_moves_no_marker_and_its_end_does(ledger: Ledger) -> None:
    start(ledger, "k1")
    marker = ledger.change_marker()  # opens the watching connection: then told at once
    fold = (
        "from jupyter_gpushare.backends.local.accounts import LedgerAccounts; "
        "from jupyter_gpushare.backends.local.ledger import Ledger; "
        "from jupyter_gpushare.config import GPUShare; "
        f"assert LedgerAccounts(Ledger({str(ledger.path)!r}), GPUShare).fold() == 1"
    )
    subprocess.run([sys.executable, "-c", fold], check=True, timeout=60)
    assert ledger.change_marker_at_once() == marker
    end = (
        "from jupyter_gpushare.backends.local.ledger import Ledger; "
        f"Ledger({str(ledger.path)!r}).release('k1')"
    )
    subprocess.run([sys.executable, "-c", end], check=True, timeout=60)
    assert ledger.change_marker_at_once() not in (None, marker)


def test_a_kernels_report_of_its_cells_moves_the_marker(ledger: Ledger, accounts: LedgerAccounts) -> None:
    """Its view shows since when it is idle and what its idle timer will do."""
    start(ledger, "k1")
    accounts.fold()
    marker = ledger.change_marker()
    assert accounts.note_activity("k1", False, time.time(), 600, "suspend")
    assert ledger.change_marker() != marker


def test_while_a_request_waits_the_fold_moves_the_marker(ledger: Ledger, accounts: LedgerAccounts) -> None:
    """The queue's order (fair share) and the expected starts go by the figures the fold writes."""
    start(ledger, "k1", "40G")
    assert ledger.release("k1") is not None  # a finished hold: what the wait estimates learn from
    start(ledger, "k2", "60G")
    waiting = NewRequest("k3", "bob", "s", "timeslice", "shared", "40G", None, ME, "python3", "b.ipynb")
    assert isinstance(ledger.request(waiting, Policy()), Waiting)
    marker = ledger.change_marker()
    assert accounts.fold() == 3
    assert ledger.change_marker() != marker


def test_a_ledger_of_an_earlier_release_gains_the_views_version(tmp_path: Path) -> None:
    """A file without the count (schema 4) is given it when a process opens it, and its marker then
    leaves out the fold as well."""
    path = tmp_path / "ledger.sqlite"
    made = Ledger(path)
    made.register_devices(POOL.devices, simulated=True)
    start(made, "k1")
    made.close()
    old = sqlite3.connect(path)
    triggers = old.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'view_%'")
    for (name,) in triggers.fetchall():
        old.execute(f"DROP TRIGGER {name}")
    old.execute("DROP TABLE view_version")
    old.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    old.commit()
    old.close()

    ledger = Ledger(path)
    try:
        marker = ledger.change_marker()
        assert views_version(ledger) == 0
        assert LedgerAccounts(ledger, lambda: GPUShare()).fold() == 1
        assert ledger.change_marker() == marker
        start(ledger, "k2")
        assert ledger.change_marker() != marker
        assert views_version(ledger) > 0
    finally:
        ledger.close()
