"""Regenerate the README's screenshots: the GPU panel (docs/panel-light.png, docs/panel-dark.png),
the size picker before a kernel starts (docs/picker.png, docs/picker-queued.png), and the panel's
Usage view (docs/usage-light.png, docs/usage-dark.png).

    .venv/bin/python scripts/screenshots.py

Uses the browser tests' machinery (tests/ui/lab.py): a real ``jupyter lab`` under a JupyterHub
base URL on a simulated 2xA100-80GB pool, Chromium from the system, two notebooks of ours with
declared usage (one near its slice), and a neighbour's kernel from a second server on the same
ledger, which shows as anonymous occupancy. The picker is shown on a node with two cards of
different sizes, partly taken, so that its choices fit now, wait, or can never run. The Usage
view shows a day replayed into the ledger's accounting: a generated day of one user's notebooks
(benchmarks/replay_trace.py) with the idle policy (suspend after 10 minutes), its slices' changes
recorded as the ledger's triggers record them and folded by the accounting itself.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

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


def replay_a_day(ledger_path: Path, owner: str, now: float) -> None:
    """A generated day of ``owner``'s notebooks, as the ledger records the changes of their
    slices, folded into the accounting (the day ends an hour ago)."""
    import random

    from replay import plan
    from replay_trace import generate

    from jupyter_gpushare.backends.accounting import store
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.core.sizes import parse_size

    trace = generate(seed=1, days=1, users=3, kernels_per_user=4)  # all shown as one user's
    shift = now - 3600 - 20 * 3600 + 8 * 3600 - min(s.start for s in trace.sessions) - 8 * 3600
    rng = random.Random(1)
    rows: list[tuple[float, str, str, str, int | None, int | None, float | None]] = []
    for number, session in enumerate(trace.sessions):
        memory = parse_size(session.memory).resolve(80 * 2**30)
        used = int(memory * rng.uniform(0.25, 0.9))
        for hold in plan(number, session, 600.0):
            key, start, end = f"replayed-{number}", hold.request + shift, hold.request + shift + hold.length
            end = min(end, now - 3600)
            if start >= end:
                continue
            rows.append((start, key, owner, "placed", memory, used if hold.resume else 0, start))
            for at, duration in session.cells or ():
                if start <= at + shift < end:
                    rows.append((at + shift, key, owner, "busy", None, None, None))
                    rows.append((min(end, at + shift + duration), key, owner, "idle", None, None, None))
                    if not hold.resume and at + shift + duration < end:
                        rows.append((at + shift + duration, key, owner, "used", None, used, None))
            rows.append((end, key, owner, "ended", memory, None, None))
    rows.sort(key=lambda row: row[0])

    def write(db: object) -> None:
        db.executemany(  # type: ignore[attr-defined]
            "INSERT INTO acct_events (at, kernel_id, owner, what, memory, used, requested_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        store.fold_events(db, now, store.Keeping())  # type: ignore[arg-type]

    ledger = Ledger(ledger_path)
    ledger.write_with(write)
    ledger.close()


def usage() -> None:
    """The panel's Usage view after a replayed day, with a notebook running now."""
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="gpushare-screenshots-usage-"))
    lab = start_lab(root, {"owner": "alice", "idle_release_after": 3600})
    try:
        replay_a_day(lab.ledger_path, "alice", time.time())
        (lab.notebook_dir / "train.ipynb").write_text(notebook("python3-gpu-8g"))
        with sync_playwright() as playwright:
            browser = launch_browser(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            open_lab(page, lab)
            panel = open_panel(page)
            page.evaluate(
                "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'train.ipynb'})"
            )
            dialog = picker_dialog(page)
            dialog.locator('input[value="16G"]').check()
            dialog.get_by_role("button", name="Start").click()
            dialog.wait_for(state="detached")
            page.locator(".jp-NotebookPanel:visible .jp-Notebook-cell").first.wait_for()
            run_cell(page, USAGE.format(memory="9.5G", base=60, swing=25, period=15))
            panel.locator(".jp-gpushare-idle").filter(has_text="will suspend").wait_for(timeout=90_000)
            # Shown again: the Usage view asks for the day's figures.
            page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]').click()
            panel = open_panel(page)
            panel.locator(".jp-gpushare-usage-chart").wait_for()
            time.sleep(3)
            page.mouse.move(900, 800)
            panel.screenshot(path=str(DOCS / "usage-light.png"))
            page.evaluate(
                "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
            )
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            time.sleep(2)
            panel.screenshot(path=str(DOCS / "usage-dark.png"))
            browser.close()
        print(f"wrote {DOCS / 'usage-light.png'} and {DOCS / 'usage-dark.png'}")
    finally:
        lab.stop()


def _answers(process: object) -> bool:
    try:
        return call(process.url, process.token, "GET", "api/gpushare/pool")[0] == 200  # type: ignore[attr-defined]
    except OSError:
        return False


if __name__ == "__main__":
    if sys.argv[1:] == ["usage"]:
        usage()  # only the Usage view's
    else:
        main()
