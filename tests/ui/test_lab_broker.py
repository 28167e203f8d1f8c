"""The GPU panel of a ``jupyter lab`` whose pool is a GPU broker's (docs/broker.md), in Chromium.

The server holds no pool of its own (no simulated devices, no ledger path): everything the panel
shows and does goes through the broker over its Unix socket, which holds the ledger.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.core.sizes import GiB

from ..support.hermetic import isolated_from_the_machine
from .conftest import VIEWPORT
from .lab import BIN, SIMULATE, Lab, free_port, make_environment, open_lab, open_panel, wait_for

ROW = ".jp-gpushare-kernel"


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.fixture(scope="module")
def broker_lab() -> Iterator[tuple[Lab, Path]]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-broker-"))
    socket, ledger = root / "broker.sock", root / "broker" / "ledger.sqlite"
    broker_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "JUPYTER_CONFIG_DIR": str(root / "broker-config"),
        "JUPYTER_RUNTIME_DIR": str(root / "broker-runtime"),
        "JUPYTER_GPUSHARE_SIMULATE": SIMULATE,
        "JUPYTER_GPUSHARE_LEDGER_PATH": str(ledger),
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.25",
        **isolated_from_the_machine(),
    }
    broker = subprocess.Popen(
        [str(BIN / "jupyter-gpushare"), "broker", "--socket", str(socket)],
        env=broker_env,
        stdout=(root / "broker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    client = BrokerClient(f"unix:{socket}")
    deadline = time.monotonic() + 30
    while True:
        try:
            client.call("GET", "info")
            break
        except UnreachableError:
            assert broker.poll() is None and time.monotonic() < deadline, (root / "broker.log").read_text()
            time.sleep(0.05)
    env = make_environment(root)
    for name in ("JUPYTER_GPUSHARE_SIMULATE", "JUPYTER_GPUSHARE_LEDGER_PATH"):
        env.pop(name)  # the lab has no pool of its own
    env["JUPYTER_GPUSHARE_BROKER_URL"] = f"unix:{socket}"
    lab = Lab(root=root, env=env, port=free_port(), token="ui-test-token").start()
    try:
        yield lab, ledger
    finally:
        lab.stop()
        broker.terminate()
        broker.wait(timeout=30)


@pytest.fixture
def broker_page(browser: Any, broker_lab: tuple[Lab, Path]) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    page = context.new_page()
    open_lab(page, broker_lab[0])
    yield page
    context.close()


def test_the_panel_works_through_a_broker(broker_page: Any, broker_lab: tuple[Lab, Path]) -> None:
    page, (lab, ledger_path) = broker_page, broker_lab
    ledger = Ledger(ledger_path)
    panel = open_panel(page)
    devices = panel.locator(".jp-gpushare-device")
    expect(devices).to_have_count(2)
    expect(devices.nth(0)).to_contain_text("GPU0 · Simulated A100-80GB")
    expect(panel.locator(".jp-gpushare-simulated-badge")).to_be_visible()
    expect(panel.locator(".jp-gpushare-connection")).to_have_text("live")

    status, started = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g"})
    assert status == 201, started
    kernel_id = started["kernel_id"]
    row = panel.locator(f'{ROW}[data-kernel-id="{kernel_id}"]')
    expect(row).to_contain_text("8G on GPU0")
    expect(devices.nth(0)).to_contain_text("free 72G of 80G")
    record = ledger.get(kernel_id)
    assert record is not None and record.memory == 8 * GiB  # held by the broker's ledger

    assert lab.request("PATCH", f"api/gpushare/kernels/{kernel_id}", {"gpu_memory": "4G"})[0] == 200
    expect(row).to_contain_text("4G on GPU0")
    row.locator(".jp-gpushare-release").click()
    expect(row).to_contain_text("no GPU (released)")
    wait_for(lambda: ledger.get(kernel_id) is None, what="the slice released in the broker's ledger")
    row.locator(".jp-gpushare-shutdown").click()
    page.locator(".jp-Dialog", has_text="Shut down the kernel?").get_by_role(
        "button", name="Shut Down"
    ).click()
    expect(panel.locator(ROW)).to_have_count(0)
    ledger.close()
    assert not (lab.root / "runtime" / "gpushare-ledger.sqlite").exists()  # the lab opened none
