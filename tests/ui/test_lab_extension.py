"""The JupyterLab extension in a real browser against a real ``jupyter lab`` (docs/users/panel.md).

Chromium (the system's) drives JupyterLab served under a JupyterHub-style base URL with token
authentication, on a simulated pool of two A100-80GB; kernels are real ipykernel processes
holding real slices in the server's ledger, which the tests read to check what the clicks did.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import GiB

from .lab import (
    Lab,
    call,
    lab_page,
    open_lab,
    open_panel,
    picker_dialog,
    run_cell,
    start_lab,
    start_notebook,
    start_other_user,
    wait_for,
)

pytestmark = pytest.mark.integration

ROW = ".jp-gpushare-kernel"


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def notebook_with_pick(page: Any, lab: Lab, kernel: str = "Python 3 (GPU)", pick: str = "4G") -> str:
    """Start a notebook from the launcher, pick a preset in the start picker; its kernel id."""
    start_notebook(page, kernel)
    dialog = picker_dialog(page)
    dialog.locator(f'input[type="radio"][value="{pick}"]').check()
    dialog.get_by_role("button", name="Start").click()
    expect(dialog).to_have_count(0)
    row = page.locator(ROW)
    expect(row).to_have_count(1, timeout=3_000)
    return str(row.get_attribute("data-kernel-id"))


def test_the_panel_shows_two_devices_and_the_simulated_badge(page: Any, lab: Lab) -> None:
    tab = page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]')
    expect(tab).to_have_attribute("title", "GPU sharing")
    panel = open_panel(page)
    expect(panel).to_have_attribute("aria-label", "GPU sharing")
    devices = panel.locator(".jp-gpushare-device")
    expect(devices).to_have_count(2)
    expect(devices.nth(0)).to_contain_text("GPU0 · Simulated A100-80GB")
    expect(devices.nth(1)).to_contain_text("GPU1 · Simulated A100-80GB")
    expect(devices.nth(0)).to_contain_text("free 80G of 80G")
    badge = panel.locator(".jp-gpushare-simulated-badge")
    expect(badge).to_be_visible()
    expect(badge).to_have_text("simulated")
    expect(panel.locator(".jp-gpushare-connection")).to_have_text("live")
    expect(panel.locator(".jp-gpushare-empty").last).to_contain_text("No GPU kernel yet")
    # The layout restorer brings the panel back after a reload (once the workspace is saved).
    wait_for(lambda: _left_area(lab) == "jupyter-gpushare-panel", what="the workspace to be saved")
    open_lab(page, lab, reset=False)
    expect(page.locator("#jp-gpushare-panel")).to_be_visible()
    expect(page.locator("#jp-gpushare-panel .jp-gpushare-device")).to_have_count(2)


def test_other_users_slices_are_anonymous_occupancy(page: Any, lab: Lab) -> None:
    other = start_other_user(lab)
    try:
        wait_for(lambda: _answers(other), timeout=60, what="the other user's server")
        status, kernel = call(
            other.url,
            other.token,
            "POST",
            "api/gpushare/kernels",
            {"name": "python3-gpu-8g", "gpu_memory": "16G"},
        )
        assert status == 201, kernel
        panel = open_panel(page)
        device = panel.locator(".jp-gpushare-device").nth(0)
        expect(device).to_contain_text("others 16G")
        expect(device.locator(".jp-gpushare-seg-others")).to_have_attribute(
            "style", re.compile(r"width: 20%")
        )
        # Not a kernel of this server: no row, no name, no path.
        expect(panel.locator(ROW)).to_have_count(0)
        call(other.url, other.token, "DELETE", f"api/kernels/{kernel['kernel_id']}")
        expect(device).to_contain_text("others 0", timeout=10_000)
    finally:
        other.terminate()
        other.wait(30)


def _left_area(lab: Lab) -> Any:
    """The widget the saved workspace shows in the left area."""
    status, workspace = lab.request("GET", "lab/api/workspaces/default")
    layout = (workspace or {}).get("data", {}).get("layout-restorer:data", {}) if status == 200 else {}
    return layout.get("left", {}).get("current")


def _answers(process: Any) -> bool:
    try:
        return call(process.url, process.token, "GET", "api/gpushare/pool")[0] == 200
    except OSError:
        return False


def test_resize_from_the_panel_changes_the_ledger(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    kernel_id = notebook_with_pick(page, lab)
    row = panel.locator(ROW)
    row.get_by_role("button", name="Resize the GPU slice of Untitled.ipynb").click()
    dialog = picker_dialog(page)
    expect(dialog).to_contain_text("Resize the GPU slice of Untitled.ipynb")
    expect(dialog.locator('input[value="4G"]')).to_be_checked()
    expect(dialog.locator('input[value="none"]')).to_have_count(0)  # release is its own button
    dialog.locator('input[value="8G"]').check()
    dialog.get_by_role("button", name="Resize").click()
    wait_for(
        lambda: (s := lab.slice_of(kernel_id)) is not None and s.memory == 8 * GiB, what="8G in the ledger"
    )
    expect(row).to_contain_text("8G on GPU0")
    expect(row.locator(".jp-gpushare-usage")).to_have_text("0 / 8 GiB")

    # A resize the pool cannot honour is refused with the server's reason, and changes nothing.
    row.get_by_role("button", name="Resize the GPU slice of Untitled.ipynb").click()
    dialog = picker_dialog(page)
    dialog.locator(".jp-gpushare-custom").fill("79G")
    other = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g", "gpu_memory": "70G"})
    assert other[0] == 201, other
    dialog.get_by_role("button", name="Resize").click()
    error = page.locator(".jp-Dialog", has_text="GPU slice not resized")
    expect(error).to_contain_text("does not fit")
    error.get_by_role("button", name="Close").click()
    assert lab.slice_of(kernel_id).memory == 8 * GiB


def test_a_queued_kernel_shows_its_position_until_it_runs(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    started = [lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g", "gpu_memory": "70G"})]
    started.append(
        lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g", "gpu_memory": "70G"})
    )
    assert [status for status, _ in started] == [201, 201], started
    status, queued = lab.request(
        "POST", "api/gpushare/kernels", {"name": "python3-gpu-8g", "gpu_memory": "70G"}
    )
    assert status == 202 and queued["state"] == "queued", queued
    row = panel.locator(f'{ROW}[data-kernel-id="{queued["kernel_id"]}"]')
    expect(row).to_contain_text("queued #1 · 70G")
    expect(row.locator(".jp-gpushare-resize")).to_be_disabled()
    expect(panel.locator(".jp-gpushare-queue")).to_have_text("1 request waiting for room (1 yours)")
    # Room is made: the queued kernel starts, and its row says where it runs.
    first = panel.locator(f'{ROW}[data-kernel-id="{started[0][1]["kernel_id"]}"]')
    first.locator(".jp-gpushare-shutdown").click()
    page.locator(".jp-Dialog", has_text="Shut down the kernel?").get_by_role(
        "button", name="Shut Down"
    ).click()
    expect(row).to_contain_text(re.compile(r"70G on GPU\d · timeslice"), timeout=30_000)
    expect(panel.locator(".jp-gpushare-queue")).to_be_hidden()


def test_release_and_shut_down_remove_the_slice(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    kernel_id = notebook_with_pick(page, lab)
    row = panel.locator(ROW)
    row.get_by_role("button", name="Release the GPU slice of Untitled.ipynb").click()
    wait_for(lambda: lab.slice_of(kernel_id) is None, what="the slice to be released")
    expect(row).to_contain_text("no GPU (released)")
    expect(row.locator(".jp-gpushare-release")).to_have_text("Request…")  # asks again
    status, kernels = lab.request("GET", "api/kernels")
    assert [k["id"] for k in kernels] == [kernel_id]  # the kernel keeps running

    # A kernel holding a slice, shut down from its row.
    status, started = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g"})
    assert status == 201, started
    held = started["kernel_id"]
    assert lab.slice_of(held) is not None
    other_row = panel.locator(f'{ROW}[data-kernel-id="{held}"]')
    expect(other_row).to_contain_text("8G on GPU0")
    other_row.locator(".jp-gpushare-shutdown").click()
    confirm = page.locator(".jp-Dialog", has_text="Shut down the kernel?")
    confirm.get_by_role("button", name="Shut Down").click()
    expect(other_row).to_have_count(0)
    wait_for(lambda: lab.slice_of(held) is None, what="the shut down kernel's slice to be freed")
    status, kernels = lab.request("GET", "api/kernels")
    assert [k["id"] for k in kernels] == [kernel_id]

    # And the released one, shut down too.
    row.get_by_role("button", name="Shut down the kernel of Untitled.ipynb").click()
    page.locator(".jp-Dialog", has_text="Shut down the kernel?").get_by_role(
        "button", name="Shut Down"
    ).click()
    expect(panel.locator(ROW)).to_have_count(0)
    assert lab.request("GET", "api/kernels")[1] == []
    assert lab.slices() == []


def test_suspend_from_the_panel_and_the_next_cell_resumes(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    kernel_id = notebook_with_pick(page, lab)
    row = panel.locator(ROW)
    run_cell(page, "from jupyter_gpushare import kernel as gpu; gpu.simulate_usage('3G'); x = 41")
    expect(row.locator(".jp-gpushare-usage")).to_have_text("3 / 4 GiB", timeout=10_000)
    row.get_by_role("button", name="Suspend the GPU state of Untitled.ipynb").click()
    wait_for(lambda: lab.slice_of(kernel_id) is None, what="the slice to be given back")
    expect(row).to_contain_text("suspended · 4G")
    expect(row.locator(".jp-gpushare-release")).to_be_disabled()
    resume = row.get_by_role("button", name="Resume the GPU state of Untitled.ipynb")
    expect(resume).to_have_text("Resume")
    # The next cell resumes the kernel, then runs.
    run_cell(page, "print(x + 1)")
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").last
    expect(output).to_contain_text(
        re.compile(r"Resuming your 3G GPU state on GPU\d[^\n]*\n42"), timeout=20_000
    )
    expect(row).to_contain_text(re.compile(r"4G on GPU\d · timeslice"))
    assert lab.slice_of(kernel_id) is not None
    # A release with memory still held says so in the row.
    row.get_by_role("button", name="Release the GPU slice of Untitled.ipynb").click()
    expect(row).to_contain_text(re.compile(r"no GPU \(released\) · 3G held on GPU\d"))


def test_an_over_limit_kernel_warns_in_its_row_and_the_status_bar(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    kernel_id = notebook_with_pick(page, lab)
    code, view = lab.request("GET", f"api/gpushare/kernels/{kernel_id}")
    assert code == 200 and view["state"] == "running", view
    status = page.locator(".jp-gpushare-status")
    # The device, then the use ("GPU 0 / 4 GiB" read like device 0).
    expect(status).to_have_text(f"GPU{view['device']} · 0 of 4 GiB used")
    expect(status).not_to_have_class(re.compile(r"jp-mod-(warn|over)"))
    run_cell(page, "from jupyter_gpushare import kernel as gpu; gpu.simulate_usage('5G')")
    row = panel.locator(ROW)
    expect(row.locator(".jp-gpushare-warning").first).to_contain_text(
        "above its slice: using 5G of 4G", timeout=10_000
    )
    expect(row).to_have_class(re.compile(r"\bjp-mod-over\b"))
    expect(row.locator(".jp-gpushare-usage")).to_have_text("5 / 4 GiB")
    expect(status).to_have_text(f"GPU{view['device']} · 5 of 4 GiB used")
    expect(status).to_have_class(re.compile(r"\bjp-mod-over\b"))
    expect(status).to_have_attribute("title", re.compile("above its slice"))
    # The status bar item is a keyboard-reachable button that opens the panel.
    page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]').click()  # hide the panel
    expect(panel).to_be_hidden()
    expect(status).to_have_attribute("role", "button")
    status.focus()
    page.keyboard.press("Enter")
    expect(panel).to_be_visible()


def test_the_stream_pauses_while_the_panel_is_hidden(page: Any, lab: Lab) -> None:
    opened: list[Any] = []
    closed: list[Any] = []
    page.on(
        "request",
        lambda r: opened.append(r) if r.url.split("?")[0].endswith("/api/gpushare/stream") else None,
    )
    page.on("requestfailed", lambda r: closed.append(r) if r in opened else None)
    open_panel(page)
    wait_for(lambda: len(opened) == 1, what="the stream to open", page=page)
    assert opened[0].url.startswith(f"{lab.server_url}api/gpushare/stream")
    page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]').click()  # collapse the panel
    wait_for(lambda: len(closed) == 1, what="the stream to close", page=page)
    open_panel(page)
    wait_for(lambda: len(opened) == 2, what="the stream to reopen", page=page)


def test_the_panel_reconnects_after_a_server_restart(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    expect(panel.locator(".jp-gpushare-connection")).to_have_text("live")
    lab.stop()
    expect(panel.locator(".jp-gpushare-connection")).to_have_text("reconnecting…", timeout=10_000)
    lab.start()
    status, started = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-4g"})
    assert status == 201, started
    # No reload: the same page's panel shows the kernel the new server started.
    expect(panel.locator(f'{ROW}[data-kernel-id="{started["kernel_id"]}"]')).to_be_visible(timeout=15_000)
    expect(panel.locator(".jp-gpushare-connection")).to_have_text("live")


def test_a_broken_ledger_shows_as_a_banner_until_it_is_mended(page: Any, lab: Lab) -> None:
    """Issue 11: the panel says what is wrong with the node's ledger and how to fix it."""
    panel = open_panel(page)
    expect(panel.locator(".jp-gpushare-device")).to_have_count(2)
    with lab.ledger_path.open("r+b") as ledger:
        ledger.write(b"garbage " * 4096)
    banner = panel.locator(".jp-gpushare-error")
    expect(banner).to_be_visible(timeout=10_000)
    expect(banner).to_contain_text(f"The GPU ledger {lab.ledger_path} is damaged")
    expect(banner).to_contain_text("mv ")
    expect(panel.locator(".jp-gpushare-empty").first).to_be_hidden()  # not "No GPU in this pool"
    lab.ledger_path.rename(lab.ledger_path.with_name("damaged-ledger.sqlite"))  # the fix
    expect(banner).to_be_hidden(timeout=10_000)
    expect(panel.locator(".jp-gpushare-device")).to_have_count(2)


@pytest.fixture(scope="module")
def overcommitted_lab(extension: Path) -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-overcommit-"))
    server = start_lab(root, gpushare={"overcommit": 1.5})
    yield server
    server.stop()


def test_the_panel_counts_free_memory_as_placement_does_under_an_overcommit(
    browser: Any, overcommitted_lab: Lab
) -> None:
    """Free is what no kernel has reserved of what a device offers: 80G × 1.5 less an 8G slice,
    as %gpu pool and a refusal count it (the panel said 72G)."""
    lab = overcommitted_lab
    lab.reset()
    code, started = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-8g"})
    assert code == 201, started
    with lab_page(browser, lab) as page:
        devices = open_panel(page).locator(".jp-gpushare-device")
        expect(devices.nth(0)).to_contain_text("free 112G of 80G ×1.5")
        expect(devices.nth(1)).to_contain_text("free 120G of 80G ×1.5")
    lab.reset()
