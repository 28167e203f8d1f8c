"""The size is picked before a gpushare kernel starts (docs/users/panel.md), in JupyterLab in Chromium.

The kernel starts once, at the picked size: opening a notebook, the launcher and "Change
Kernel" never start one at the kernelspec's size first; Cancel starts nothing; a start that must
wait says so in the notebook and can be withdrawn. What the clicks did is read from the server:
its ledger, its kernels and sessions, and its log of placements.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import GiB

from .lab import (
    Lab,
    change_kernel,
    fit_note,
    gpu_card,
    kernel_name,
    open_panel,
    picker_dialog,
    run_cell,
    start_notebook,
    wait_for,
)

pytestmark = pytest.mark.integration

ROW = ".jp-gpushare-kernel"
STARTED_WITHIN = 120_000  # ms: a kernel process starts in a few seconds, far slower on a busy machine
PLACEMENT = re.compile(r"Kernel (\S+) holds a \w+ GPU slice \((\d+) bytes\)")


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def hold(lab: Lab, size: str) -> str:
    """A kernel of another notebook holding ``size`` (started over REST); its id."""
    status, kernel = lab.request(
        "POST", "api/gpushare/kernels", {"name": gpushare_name("8G"), "gpu_memory": size}
    )
    assert status == 201, kernel
    return str(kernel["kernel_id"])


def gpushare_name(size: str) -> str:
    return f"python3-gpu-{size.lower()}"


def kernel_ids(lab: Lab) -> set[str]:
    return {kernel["id"] for kernel in lab.request("GET", "api/kernels")[1]}


def session_kernels(lab: Lab) -> list[str]:
    return [session["kernel"]["id"] for session in lab.request("GET", "api/sessions")[1]]


def test_picking_2g_on_an_8g_kernelspec_starts_one_kernel_at_once_holding_2g(page: Any, lab: Lab) -> None:
    # Each card holds 76G of other kernels: 4G free on each, so 8G would have to wait.
    others = {hold(lab, "76G"), hold(lab, "76G")}
    log_from = len(lab.log())
    writes: list[str] = []
    page.on(
        "request",
        lambda r: (
            writes.append(f"{r.method} {r.url.split('?')[0]}") if r.method in ("POST", "PATCH") else None
        ),
    )
    panel = open_panel(page)
    start_notebook(page, gpu_card("8G"))
    dialog = picker_dialog(page)
    expect(dialog).to_contain_text("GPU for Untitled.ipynb")
    expect(dialog.locator('input[value="8G"]')).to_be_checked()  # the kernelspec's size first
    expect(fit_note(dialog, "8G")).to_have_text(re.compile(r"^queue position 1, wait "))
    expect(fit_note(dialog, "2G")).to_have_text("fits now on GPU0, 4G free")
    assert kernel_ids(lab) == others  # the dialog is open and nothing has started

    dialog.locator('input[value="2G"]').check()
    dialog.get_by_role("button", name="Start").click()
    row = panel.locator(ROW, has_text="Untitled.ipynb")
    expect(row).to_contain_text("2G on GPU0", timeout=10_000)
    kernel_id = str(row.get_attribute("data-kernel-id"))
    wait_for(lambda: session_kernels(lab) == [kernel_id], what="the notebook's session on that kernel")
    assert kernel_ids(lab) == others | {kernel_id}
    held = lab.slice_of(kernel_id)
    assert held is not None and (held.memory, held.size) == (2 * GiB, "2G")
    expect(kernel_name(page)).to_have_text(gpu_card("8G"), timeout=STARTED_WITHIN)
    # The server placed one slice since, of 2G: none of 8G was held, none queued, none resized.
    log = lab.log()[log_from:]
    assert PLACEMENT.findall(log) == [(kernel_id, str(2 * GiB))]
    assert "waits for a GPU slice" not in log
    assert [w for w in writes if w.startswith("PATCH") and "/api/gpushare/" in w] == []
    assert [w for w in writes if w.endswith("/api/gpushare/kernels")] == [
        f"POST {lab.server_url}api/gpushare/kernels"
    ]

    # Any other start of a gpushare kernelspec by name (here a script's) asks too, offering
    # the notebook's last pick first; the new kernel takes the old one's place.
    page.evaluate(
        "() => { void window.jupyterapp.shell.currentWidget.sessionContext.changeKernel("
        "{name: 'python3-gpu-8g'}) }"
    )
    dialog = picker_dialog(page)
    expect(dialog.locator('input[value="2G"]')).to_be_checked()
    dialog.get_by_role("button", name="Start").click()
    new_id = wait_for(
        lambda: (ids := session_kernels(lab)) and ids[0] != kernel_id and ids[0], what="the new kernel"
    )
    assert PLACEMENT.findall(lab.log()[log_from:]) == [(kernel_id, str(2 * GiB)), (new_id, str(2 * GiB))]
    wait_for(lambda: kernel_ids(lab) == others | {new_id}, what="the first kernel to be shut down")


def test_cancel_starts_nothing_and_select_kernel_asks_again(page: Any, lab: Lab) -> None:
    # One "Python 3 (GPU)" card with the GPU logo; the fixed sizes ordered by size.
    titles = page.locator('.jp-LauncherCard[data-category="Notebook"]').evaluate_all(
        "cards => cards.map(card => card.title)"
    )
    sizes = [title for title in titles if title in {gpu_card(s) for s in ("4G", "8G", "16G")}]
    assert sizes == [gpu_card("4G"), gpu_card("8G"), gpu_card("16G")]
    card = page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{gpu_card()}"]')
    expect(card.locator("img.jp-Launcher-kernelIcon")).to_have_attribute("src", re.compile(r"logo-svg"))

    start_notebook(page)
    dialog = picker_dialog(page)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(kernel_name(page)).to_have_text("No Kernel")
    expect(page.locator(".jp-Dialog")).to_have_count(0)  # no error, no other question
    assert kernel_ids(lab) == set() and session_kernels(lab) == [] and lab.records() == []

    change_kernel(page, gpu_card())
    dialog = picker_dialog(page)
    dialog.locator('input[value="2G"]').check()
    dialog.get_by_role("button", name="Start").click()
    expect(kernel_name(page)).to_have_text(gpu_card(), timeout=STARTED_WITHIN)
    [kernel_id] = wait_for(lambda: session_kernels(lab), what="the notebook's session")
    held = lab.slice_of(kernel_id)
    assert held is not None and held.memory == 2 * GiB
    # ipywidgets work: the notebook's widget manager follows a kernel that came after it opened.
    run_cell(page, "import ipywidgets; ipywidgets.IntSlider(value=3)")
    expect(page.locator(".jp-NotebookPanel:visible .widget-slider")).to_be_visible(timeout=30_000)


def test_a_queued_start_waits_in_the_notebook_and_can_be_withdrawn(page: Any, lab: Lab) -> None:
    first, _ = hold(lab, "78G"), hold(lab, "78G")
    start_notebook(page)
    dialog = picker_dialog(page)
    expect(fit_note(dialog, "4G")).to_have_text(re.compile(r"^queue position 1, wait "))
    dialog.get_by_role("button", name="Start").click()  # 4G, the configured default
    indicator = page.locator(".jp-NotebookPanel:visible .jp-gpushare-start-indicator")
    expect(indicator).to_contain_text("waiting for GPU (position 1)")
    [queued] = wait_for(lab.queued, what="the queued request")
    assert queued.size == "4G"
    indicator.get_by_role("button", name="Cancel the wait for a GPU").click()
    expect(indicator).to_be_hidden()
    wait_for(lambda: lab.queued() == [], what="the request to leave the queue")
    expect(kernel_name(page)).to_have_text("No Kernel")
    assert session_kernels(lab) == []

    # Again; this time room is made while it waits: the kernel starts, the notebook has it.
    change_kernel(page, gpu_card())
    dialog = picker_dialog(page)
    expect(dialog.locator('input[value="4G"]')).to_be_checked()
    dialog.get_by_role("button", name="Start").click()
    expect(indicator).to_contain_text("waiting for GPU (position 1)")
    assert lab.request("DELETE", f"api/kernels/{first}")[0] == 204
    expect(indicator).to_be_hidden(timeout=30_000)
    expect(kernel_name(page)).to_have_text(gpu_card(), timeout=STARTED_WITHIN)
    [kernel_id] = session_kernels(lab)
    held = lab.slice_of(kernel_id)
    assert held is not None and held.memory == 4 * GiB


def test_a_custom_size_is_checked_inline_and_only_a_valid_one_is_sent(page: Any, lab: Lab) -> None:
    asked: list[str] = []
    page.on(
        "request",
        lambda r: asked.append(f"{r.method} {urllib.parse.unquote(r.url)}") if "/api/" in r.url else None,
    )
    start_notebook(page)
    dialog = picker_dialog(page)
    start = dialog.get_by_role("button", name="Start")
    custom = dialog.get_by_role("textbox", name="Custom GPU size")
    message = dialog.locator(".jp-gpushare-picker-message")
    for typed, problem in (
        ("abc", "Cannot read GPU size 'abc'; accepted forms: 4G"),
        ("0", "must be more than zero"),
        ("100G", "100G is larger than any GPU here (the largest has 80G)"),
    ):
        custom.fill(typed)
        expect(start).to_be_disabled()
        expect(message).to_contain_text(problem)
        expect(custom).to_have_attribute("aria-invalid", "true")
        custom.press("Enter")  # Enter does not accept an invalid size either
        expect(dialog).to_be_visible()
        # The picker asks the server about its choices again: never about the refused size.
        with page.expect_request(lambda r: "/api/gpushare/fit?" in r.url) as renewed:
            pass
        assert f"gpu_memory={typed}&" not in urllib.parse.unquote(renewed.value.url) + "&"
    assert not [a for a in asked if "abc" in a or "100G" in a or "gpu_memory=0&" in a + "&"]
    starts = ("/api/gpushare/", "/api/sessions", "/api/kernels")
    assert not [a for a in asked if a.startswith(("POST", "PATCH")) and any(s in a for s in starts)]

    custom.fill("6G")
    expect(start).to_be_enabled()
    expect(message).to_have_text("6G of GPU memory.")
    expect(fit_note(dialog, "custom")).to_have_text("fits now on GPU0, 80G free")
    mode = dialog.get_by_role("combobox", name="GPU sharing mode")
    mode.select_option("vgpu")  # the mode is passed with the size; the kernelspec stays
    with page.expect_request(
        lambda r: r.method == "POST" and r.url.split("?")[0].endswith("/api/gpushare/kernels")
    ) as post:
        start.click()
    assert post.value.post_data_json["gpu_memory"] == "6G"
    [kernel_id] = wait_for(lambda: session_kernels(lab), what="the notebook's session")
    held = lab.slice_of(kernel_id)
    assert held is not None and (held.memory, held.mode) == (6 * GiB, "vgpu")


def test_kernel_actions_are_commands_in_the_palette(page: Any, lab: Lab) -> None:
    start_notebook(page)
    dialog = picker_dialog(page)
    dialog.get_by_role("button", name="Start").click()
    [kernel_id] = wait_for(lambda: session_kernels(lab), what="the notebook's session")
    wait_for(lambda: lab.slice_of(kernel_id), what="the slice")
    commands = page.evaluate(
        "() => window.jupyterapp.commands.listCommands().filter(id => id.startsWith('gpushare:'))"
    )
    assert {
        "gpushare:resize-kernel",
        "gpushare:release-kernel",
        "gpushare:shutdown-kernel",
        "gpushare:open-kernel-notebook",
    } <= set(commands)
    # The command is enabled once the panel's model has seen the kernel's slice (the next sample).
    wait_for(
        lambda: page.evaluate("() => window.jupyterapp.commands.isEnabled('gpushare:release-kernel')"),
        what="the release command to be enabled",
    )
    # Opened by its command once the notebook is connected to its kernel: the shortcut goes
    # wherever the focus is, and a notebook still coming up takes the focus and closes the
    # palette again (so it is opened until it stays open).
    expect(page.get_by_text("Python 3 (GPU) | Idle")).to_be_visible(timeout=STARTED_WITHIN)
    palette = page.locator("#command-palette")

    def palette_open() -> bool:
        if palette.locator("input").is_visible():
            return True
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:activate-command-palette')")
        return False

    wait_for(palette_open, timeout=60, what="the command palette to stay open", page=page)
    palette.locator("input").fill("Release the GPU Slice of This Kernel")
    enabled = palette.locator(".lm-CommandPalette-item:not(.lm-mod-disabled)")
    enabled.filter(has_text="Release the GPU Slice of This Kernel").click()
    wait_for(lambda: lab.slice_of(kernel_id) is None, what="the slice to be released")
    assert kernel_ids(lab) == {kernel_id}  # the kernel keeps running
