"""What a gpushare kernel costs around every cell: it reaches its slice through its kind's
kernel-facing calls (``CellNotes``), and those open the node ledger once for the whole kernel —
one ``Ledger``, a connection per thread that asks — build no backend (no device is probed before
``%gpu``), and open nothing more per cell.

Every sqlite connection the kernel opens is counted from its first line of Python on: a
``sitecustomize`` on the kernel's path wraps ``sqlite3.connect`` before the extension loads.
Before the kernel reached its slice through one way, it held two ledgers (its own slice's and the
warnings'), with seven connections between them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager

from ..support.kernels import kernel_manager, run_cell
from ..support.nodes import Node
from ..support.polling import async_wait_until

pytestmark = pytest.mark.integration

COUNTING = """\
import sqlite3
import threading

sqlite3.gpushare_opened = []
_connect = sqlite3.connect


def _counted(database, *args, **kwargs):
    sqlite3.gpushare_opened.append((str(database), threading.current_thread().name))
    return _connect(database, *args, **kwargs)


sqlite3.connect = _counted
"""

REPORT = """\
import gc, json, sqlite3
from jupyter_gpushare.backends.local.ledger import Ledger
print(json.dumps({{
    "ledger_connections": [thread for path, thread in sqlite3.gpushare_opened if {ledger!r} in path],
    "ledgers": sum(isinstance(o, Ledger) for o in gc.get_objects()),
    "backends": [type(o).__name__ for o in gc.get_objects() if type(o).__name__.endswith("Backend")],
}}))
"""


@pytest.fixture
async def counted_kernels(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AsyncMultiKernelManager]:
    site = tmp_path / "counting"
    site.mkdir()
    (site / "sitecustomize.py").write_text(COUNTING)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    manager = kernel_manager()
    yield manager
    await manager.shutdown_all(now=True)


async def report(node: Node, manager: AsyncMultiKernelManager, kernel_id: str) -> dict[str, Any]:
    cell = await run_cell(manager.get_kernel(kernel_id), REPORT.format(ledger=str(node.ledger_path)))
    assert cell.error is None, cell
    answer: dict[str, Any] = json.loads(cell.stdout)
    return answer


async def run_cells(node: Node, manager: AsyncMultiKernelManager, kernel_id: str, count: int) -> None:
    """``count`` cells, and the accounting told of the last one (its own thread asks the ledger)."""
    started = time.time()
    for _ in range(count):
        cell = await run_cell(manager.get_kernel(kernel_id), "x = 1")
        assert cell.error is None, cell
    ledger = node.ledger

    def noted() -> bool:
        rows = ledger.read_with(
            lambda db: db.execute("SELECT at FROM acct_activity WHERE kernel_id = ?", (kernel_id,)).fetchall()
        )
        return bool(rows) and rows[0][0] >= started

    await async_wait_until(noted, timeout=60, message="the cells noted in the ledger")


async def test_cells_open_the_ledger_once_and_probe_nothing(
    node: Node, counted_kernels: AsyncMultiKernelManager
) -> None:
    kernel_id = await counted_kernels.start_kernel(kernel_name="python3-gpu-4g")
    await run_cells(node, counted_kernels, kernel_id, 3)
    settled = await report(node, counted_kernels, kernel_id)

    await run_cells(node, counted_kernels, kernel_id, 10)
    after = await report(node, counted_kernels, kernel_id)

    assert after == settled, "ten more cells opened something"
    assert after["ledgers"] == 1, after
    # The ledger opened once: three connections by the first thread that asks (the file checked,
    # its commits watched, the thread's own), one by the other. Before: seven, with two ledgers.
    assert 1 <= len(after["ledger_connections"]) <= 4, after
    assert after["backends"] == [], "a backend was built (devices probed) before %gpu needed one"

    # The count sees a backend where one is built: %gpu builds it.
    status = await run_cell(counted_kernels.get_kernel(kernel_id), "%gpu status")
    assert "GPU slice: 4G" in status.result, status
    assert (await report(node, counted_kernels, kernel_id))["backends"] == ["LocalBackend"]
