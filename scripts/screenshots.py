"""Regenerate the README's screenshots: the GPU panel (docs/panel-light.png, docs/panel-dark.png)
and the size picker before a kernel starts (docs/picker.png, docs/picker-queued.png).

    .venv/bin/python scripts/screenshots.py

Uses the browser tests' machinery (tests/ui/lab.py): a real ``jupyter lab`` under a JupyterHub
base URL on a simulated 2xA100-80GB pool, Chromium from the system, two notebooks of ours with
declared usage (one near its slice), and a neighbour's kernel from a second server on the same
ledger, which shows as anonymous occupancy. The picker is shown on a node with two cards of
different sizes, partly taken, so that its choices fit now, wait, or can never run.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ui.lab import (  # noqa: E402
    call,
    fit_note,
    installed_extension,
    launch_browser,
    open_lab,
    open_panel,
    picker_dialog,
    run_cell,
    start_lab,
    start_other_user,
    wait_for,
)

DOCS = REPO / "docs"
VIEWPORT = {"width": 1280, "height": 760}

# Declared usage that moves, so the sparklines have a shape.
USAGE = """\
import math, threading, time
from jupyter_gpushare import kernel as gpu
def _wave(memory, base, swing, period):
    t0 = time.time()
    while True:
        phase = (time.time() - t0) / period * 2 * math.pi
        gpu.simulate_usage(memory, utilization=int(base + swing * math.sin(phase)))
        time.sleep(0.5)
threading.Thread(target=_wave, args=({memory!r}, {base}, {swing}, {period}), daemon=True).start()
"""


def notebook(kernel: str) -> str:
    return json.dumps(
        {
            "cells": [],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def main() -> None:
    installed_extension()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="gpushare-screenshots-"))
    lab = start_lab(root)
    neighbour = start_other_user(lab)
    try:
        wait_for(lambda: _answers(neighbour), timeout=60, what="the neighbour's server")
        status, body = call(
            neighbour.url,  # type: ignore[attr-defined]
            neighbour.token,  # type: ignore[attr-defined]
            "POST",
            "api/gpushare/kernels",
            {"name": "python3-gpu-8g", "gpu_memory": "24G"},
        )
        assert status == 201, body
        (lab.notebook_dir / "train.ipynb").write_text(notebook("python3-gpu-8g"))
        (lab.notebook_dir / "explore.ipynb").write_text(notebook("python3-gpu-4g"))
        with sync_playwright() as playwright:
            browser = launch_browser(playwright)
            page = browser.new_page(viewport=VIEWPORT)
            open_lab(page, lab)
            open_panel(page)
            for name, pick, memory, base, swing, period in (
                ("train.ipynb", "16G", "12.5G", 70, 20, 20),
                ("explore.ipynb", "4G", "3.8G", 25, 15, 9),
            ):
                page.evaluate(
                    f"() => window.jupyterapp.commands.execute('docmanager:open', {{path: '{name}'}})"
                )
                dialog = picker_dialog(page)
                dialog.locator(f'input[value="{pick}"]').check()
                dialog.get_by_role("button", name="Start").click()
                dialog.wait_for(state="detached")
                # The notebook has its kernel once it runs: the picked size, started once.
                page.locator(
                    ".jp-NotebookPanel:visible .jp-Toolbar-kernelName", has_text="GPU"
                ).first.wait_for()
                page.locator(".jp-NotebookPanel:visible .jp-Notebook-cell").first.wait_for()
                run_cell(page, USAGE.format(memory=memory, base=base, swing=swing, period=period))
                time.sleep(1)
            page.locator(".jp-gpushare-warning").first.wait_for(timeout=30_000)
            time.sleep(25)  # let the sparklines fill
            page.mouse.move(900, 700)
            page.screenshot(path=str(DOCS / "panel-light.png"))
            page.evaluate(
                "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
            )
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            time.sleep(2)
            page.screenshot(path=str(DOCS / "panel-dark.png"))
            browser.close()
        print(f"wrote {DOCS / 'panel-light.png'} and {DOCS / 'panel-dark.png'}")
    finally:
        neighbour.terminate()
        neighbour.wait(30)
        lab.stop()
    picker()


def picker() -> None:
    """The start picker on an A100-40GB with 10G free and a T4-16GB with 4G free."""
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="gpushare-screenshots-picker-"))
    lab = start_lab(root, {"simulate": "1xA100-40GB,1xT4-16GB", "sizes": ["2G", "8G", "24G", "whole", "64G"]})
    try:
        for size in ("30G", "12G"):
            status, body = lab.request(
                "POST", "api/gpushare/kernels", {"name": "python3-gpu-4g", "gpu_memory": size}
            )
            assert status == 201, body
        (lab.notebook_dir / "train.ipynb").write_text(notebook("python3-gpu"))
        with sync_playwright() as playwright:
            browser = launch_browser(playwright)
            page = browser.new_page(viewport=VIEWPORT)
            open_lab(page, lab)
            page.evaluate(
                "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'train.ipynb'})"
            )
            dialog = picker_dialog(page)
            dialog.locator('input[value="24G"]').check()
            fit_note(dialog, "64G").filter(has_text="larger than any card").wait_for()
            dialog.locator(".jp-gpushare-custom").fill("6G")
            fit_note(dialog, "custom").filter(has_text="fits now").wait_for()
            dialog.locator('input[value="24G"]').check()
            page.mouse.move(900, 700)
            dialog.screenshot(path=str(DOCS / "picker.png"))
            dialog.get_by_role("button", name="Start").click()
            indicator = page.locator(".jp-NotebookPanel:visible .jp-gpushare-start-indicator")
            indicator.filter(has_text="waiting for GPU").wait_for()
            page.screenshot(
                path=str(DOCS / "picker-queued.png"), clip={"x": 280, "y": 30, "width": 1000, "height": 110}
            )
            browser.close()
        print(f"wrote {DOCS / 'picker.png'} and {DOCS / 'picker-queued.png'}")
    finally:
        lab.stop()


def _answers(process: object) -> bool:
    try:
        return call(process.url, process.token, "GET", "api/gpushare/pool")[0] == 200  # type: ignore[attr-defined]
    except OSError:
        return False


if __name__ == "__main__":
    main()
