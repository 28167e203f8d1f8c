"""Two OS processes starting 20 kernels at once on one ledger never reserve more than capacity.

The invariant is checked after every step, not only at the end: sqlite triggers on the ledger
record the reserved total of each device after every insert, update and delete, inside the same
transaction as the change, so no intermediate state escapes the check.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.core.sizes import GiB

from ..support.kernels import MANY_STARTER
from ..support.nodes import Node

pytestmark = pytest.mark.integration


OBSERVE = """
CREATE TABLE observations (step INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT, device TEXT,
                           reserved INTEGER, capacity INTEGER, running INTEGER);
CREATE TRIGGER observe_{event} AFTER {event} ON slices BEGIN
  INSERT INTO observations (event, device, reserved, capacity, running)
  SELECT '{event}', d.uuid,
         (SELECT COALESCE(SUM(s.memory), 0) FROM slices s
           WHERE s.state = 'running' AND s.device_uuid = d.uuid),
         d.memory_total,
         (SELECT COUNT(*) FROM slices s WHERE s.state = 'running' AND s.device_uuid = d.uuid)
  FROM devices d;
END;
"""


def install_observer(ledger_path: Path) -> None:
    with sqlite3.connect(ledger_path) as db:
        for index, event in enumerate(("INSERT", "UPDATE", "DELETE")):
            script = OBSERVE.format(event=event)
            if index:
                script = script.split(";", 1)[1]  # the table exists already
            db.executescript(script)


def test_two_processes_starting_twenty_kernels_never_exceed_capacity(node: Node) -> None:
    node.ledger.register_devices(parse_simulation("1xA100-80GB").devices, simulated=True)
    install_observer(node.ledger_path)

    workers = [
        subprocess.Popen([sys.executable, str(MANY_STARTER), "python3-gpu-16g", "10"], env=node.env)
        for _ in range(2)
    ]
    for worker in workers:
        assert worker.wait(timeout=400) == 0

    with sqlite3.connect(node.ledger_path) as db:
        steps = db.execute("SELECT event, reserved, capacity, running FROM observations").fetchall()
    placements = [step for step in steps if step[0] == "UPDATE"]
    # Every kernel was queued (INSERT), placed and attached (UPDATEs) and released (DELETE).
    assert sum(1 for step in steps if step[0] == "INSERT") == 20
    assert sum(1 for step in steps if step[0] == "DELETE") == 20
    assert all(reserved <= capacity for _, reserved, capacity, _ in steps), "capacity exceeded"
    assert all(running <= 5 for *_, running in steps)
    # The card really filled up: five 16G slices at once, so the test exercised contention.
    assert max(reserved for _, reserved, _, _ in placements) == 80 * GiB
    assert node.ledger.records() == []
