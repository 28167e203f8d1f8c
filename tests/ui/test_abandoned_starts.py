"""No kernel left behind by a browser (issue 25), in JupyterLab in Chromium.

A notebook closed while its start waits withdraws the start; a browser tab closed while it
waits stops asking, and the server withdraws it; a notebook reopened takes up the kernel its
closed tab left unused instead of starting a second one; running a cell while the start waits
offers no second kernel; the panel's row of a queued start cancels it, and the row of a kernel
that released its slice asks for one again. What the clicks did is read from the server.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_gpushare.core.sizes import GiB

from .lab import (
    Lab,
    kernel_name,
    lab_page,
    open_panel,
    picker_dialog,
    run_cell,
    start_lab,
    start_notebook,
    wait_for,
)

pytestmark = pytest.mark.integration

ROW = ".jp-gpushare-kernel"
INDICATOR = ".jp-NotebookPanel:visible .jp-gpushare-start-indicator"
QUICK = 5.0  # GPUShare.unused_kernel_timeout of the quick server, seconds


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def hold(lab: Lab, size: str) -> str:
    """A kernel of another notebook holding ``size`` on one card (started over REST, with a
    session of its own, so that no server reclaims it as unused); its id."""
    status, kernel = lab.request(
        "POST", "api/gpushare/kernels", {"name": "python3-gpu-8g", "gpu_memory": size}
    )
    assert status == 201, kernel
    kernel_id = str(kernel["kernel_id"])
    session = {
        "path": f"holder-{kernel_id}.ipynb",
        "type": "notebook",
        "name": "",
        "kernel": {"id": kernel_id},
    }
    assert lab.request("POST", "api/sessions", session)[0] == 201
    return kernel_id


def kernel_ids(lab: Lab) -> set[str]:
    return {kernel["id"] for kernel in lab.request("GET", "api/kernels")[1]}


def session_kernels(lab: Lab) -> list[str]:
    return [session["kernel"]["id"] for session in lab.request("GET", "api/sessions")[1]]


def queue_a_start(page: Any, lab: Lab) -> tuple[set[str], str]:
    """Both cards full; a new notebook's 4G start waits in the queue. The holders' ids and the
    queued start's."""
    holders = {hold(lab, "78G"), hold(lab, "78G")}
    start_notebook(page)
    picker_dialog(page).get_by_role("button", name="Start").click()  # 4G, the default
    expect(page.locator(INDICATOR)).to_contain_text("waiting for GPU (position 1)")
    [queued] = wait_for(lab.queued, what="the queued request")
    return holders, queued.kernel_id


def free_room(lab: Lab, holders: set[str]) -> None:
    for kernel_id in holders:
        assert lab.request("DELETE", f"api/kernels/{kernel_id}")[0] == 204
    wait_for(
        lambda: not {record.kernel_id for record in lab.slices()} & holders, what="the holders' slices freed"
    )


def test_a_notebook_closed_while_its_start_waits_withdraws_the_start(page: Any, lab: Lab) -> None:
    """Failed before: the start went on waiting for a notebook that was gone, then started."""
    holders, queued = queue_a_start(page, lab)
    page.evaluate("() => window.jupyterapp.commands.execute('application:close')")
    discard = page.locator(".jp-Dialog").get_by_role("button", name="Discard")
    if discard.count():  # an untitled notebook may ask before it closes
        discard.click()
    expect(page.locator(".jp-NotebookPanel")).to_have_count(0)
    wait_for(lambda: lab.queued() == [], what="the start to leave the queue")
    free_room(lab, holders)
    assert kernel_ids(lab) == set() and lab.records() == []
    assert lab.request("GET", f"api/gpushare/kernels/{queued}")[0] >= 400


def test_running_a_cell_while_the_start_waits_offers_no_second_kernel(page: Any, lab: Lab) -> None:
    """Failed before: "Select Kernel" opened, preset to start a second kernel."""
    holders, queued = queue_a_start(page, lab)
    run_cell(page, "print('hello')", wait_for_kernel_first=False)
    expect(page.locator(".jp-toast-message", has_text="still starting")).to_be_visible()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert [record.kernel_id for record in lab.records() if record.state == "queued"] == [queued]
    # Room is made: the one start runs, and the notebook has it.
    free_room(lab, holders)
    expect(page.locator(INDICATOR)).to_be_hidden(timeout=30_000)
    wait_for(lambda: session_kernels(lab) == [queued], what="the notebook's session on the queued start")
    assert kernel_ids(lab) == {queued}


def test_a_reopened_notebook_takes_up_the_kernel_its_closed_tab_left(page: Any, lab: Lab) -> None:
    """A tab closed right after *Start* leaves a kernel no session refers to; the panel says
    so, and opening the notebook again takes it up. Failed before: the picker offered a new
    kernel, and the panel showed two rows of the same notebook."""
    notebook = lab.notebook_dir / "left.ipynb"
    kernelspec = {"name": "python3-gpu", "display_name": "Python 3 (GPU)", "language": "python"}
    nbformat.write(nbformat.v4.new_notebook(metadata={"kernelspec": kernelspec}), notebook)
    # What the picker had started for that notebook before its tab closed.
    status, left = lab.request(
        "POST", "api/gpushare/kernels", {"name": "python3-gpu", "path": "left.ipynb", "gpu_memory": "8G"}
    )
    assert status == 201, left
    panel = open_panel(page)
    row = panel.locator(f'{ROW}[data-kernel-id="{left["kernel_id"]}"]')
    expect(row).to_contain_text("not open · 8G on GPU", timeout=30_000)
    expect(row.locator(".jp-gpushare-warning")).to_contain_text("no notebook or console uses this kernel")

    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'left.ipynb'})")
    wait_for(lambda: session_kernels(lab) == [left["kernel_id"]], what="the notebook's session on its kernel")
    expect(kernel_name(page)).to_have_text("Python 3 (GPU)", timeout=30_000)
    expect(page.locator(".jp-Dialog")).to_have_count(0)  # no picker: the size was picked before
    expect(panel.locator(ROW)).to_have_count(1)
    expect(row).not_to_contain_text("not open", timeout=30_000)
    assert kernel_ids(lab) == {left["kernel_id"]}
    held = lab.slice_of(left["kernel_id"])
    assert held is not None and held.memory == 8 * GiB


def test_the_row_of_a_queued_start_cancels_it_and_a_released_row_asks_again(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    start_notebook(page)
    picker_dialog(page).get_by_role("button", name="Start").click()
    [kernel_id] = wait_for(lambda: session_kernels(lab), what="the notebook's session")
    row = panel.locator(f'{ROW}[data-kernel-id="{kernel_id}"]')
    expect(row).to_contain_text("4G on GPU", timeout=30_000)
    row.get_by_role("button", name="Release the GPU slice of Untitled.ipynb").click()
    expect(row).to_contain_text("no GPU (released)")
    wait_for(lambda: lab.slice_of(kernel_id) is None, what="the slice to be released")

    again = row.get_by_role("button", name="Request a GPU slice for Untitled.ipynb")
    expect(again).to_have_text("Request…")
    again.click()
    dialog = picker_dialog(page)
    expect(dialog).to_contain_text("Request a GPU slice for Untitled.ipynb")
    dialog.locator('input[value="8G"]').check()
    dialog.get_by_role("button", name="Request").click()
    expect(row).to_contain_text("8G on GPU", timeout=30_000)
    held = wait_for(lambda: lab.slice_of(kernel_id), what="the new slice")
    assert held.memory == 8 * GiB and kernel_ids(lab) == {kernel_id}
    # The kernel sees its new slice as %gpu request in a cell would have set it.
    run_cell(page, "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])")
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").last
    expect(output).to_have_text(str(8 * GiB), timeout=30_000)

    # A start that waits in the queue: its row offers Cancel, not Release, and no Shut down.
    hold(lab, "72G")
    hold(lab, "80G")
    status, waiting = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-16g"})
    assert status == 202, waiting
    queued = panel.locator(f'{ROW}[data-kernel-id="{waiting["kernel_id"]}"]')
    expect(queued).to_contain_text("queued #1 · 16G")
    expect(queued.locator(".jp-gpushare-shutdown")).to_be_disabled()
    cancel = queued.get_by_role("button", name="Cancel the GPU start of python3-gpu-16g")
    expect(cancel).to_have_text("Cancel")
    cancel.click()
    expect(queued).to_have_count(0, timeout=30_000)
    assert lab.queued() == []
    assert waiting["kernel_id"] not in kernel_ids(lab)


# ---- a server that reclaims within seconds -------------------------------------------------------


@pytest.fixture(scope="module")
def quick_lab(extension: Path) -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-quick-"))
    server = start_lab(root, gpushare={"unused_kernel_timeout": QUICK})
    yield server
    server.stop()


def test_a_browser_tab_closed_while_its_start_waits_is_withdrawn_by_the_server(
    browser: Any, quick_lab: Lab
) -> None:
    """Failed before: once room appeared the kernel started and held its slice for nobody."""
    lab = quick_lab
    lab.reset()
    with lab_page(browser, lab) as page:
        holders, queued = queue_a_start(page, lab)
    # The tab is gone: nothing asks after the start any more.
    wait_for(lambda: lab.queued() == [], timeout=60, what="the server to withdraw the start")
    # Withdrawn by the server's look (it logs before it releases), not lost some other way.
    log = lab.log()
    assert f"withdrew the queued start of kernel {queued}" in log, (lab.records(), log[-4000:])
    free_room(lab, holders)
    assert kernel_ids(lab) == set() and lab.records() == []
