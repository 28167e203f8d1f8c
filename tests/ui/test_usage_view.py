"""The panel's Usage view in a real browser (docs/admins/accounting.md): the day's reserved and used
memory drawn
as a chart from ``GET usage``, in the light and the dark theme, and the idle words of a row."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .lab import Lab, open_panel, picker_dialog, run_cell, start_notebook, wait_for

pytestmark = pytest.mark.integration

ROW = ".jp-gpushare-kernel"
CHART = ".jp-gpushare-usage .jp-gpushare-usage-chart"


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def reopen(page: Any) -> Any:
    """Hide and show the panel: the Usage view asks the server again when shown."""
    page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]').click()
    expect(page.locator("#jp-gpushare-panel")).to_be_hidden()
    return open_panel(page)


def last_of(path: str) -> float:
    """The height (y) a chart's path reaches over its last step, the one that holds now (the
    area's closing corner on the axis is lower, so the least y at the right edge)."""
    points = [(float(x), float(y)) for x, y in re.findall(r"[ML]([\d.]+),([\d.]+)", path)]
    width = max(x for x, _ in points)
    return min(y for x, y in points if x == width)


def test_the_usage_chart_draws_the_days_reserved_and_used_memory_in_both_themes(page: Any, lab: Lab) -> None:
    panel = open_panel(page)
    # The day's section by its name: a kernel row's use is a .jp-gpushare-usage too, and a row
    # of the session's previous test can still be listed while that kernel shuts down.
    usage = panel.get_by_role("region", name="GPU usage over the last day")
    expect(usage).to_be_visible()  # (the session's other tests may have used the day already)
    start_notebook(page)
    dialog = picker_dialog(page)
    dialog.locator('input[type="radio"][value="8G"]').check()
    dialog.get_by_role("button", name="Start").click()
    expect(panel.locator(ROW)).to_have_count(1, timeout=30_000)
    run_cell(page, "from jupyter_gpushare import kernel as gpu; gpu.simulate_usage('6G')")
    # A loaded machine: the kernel connects, runs the cell, and its next report comes.
    expect(panel.locator(f"{ROW} .jp-gpushare-usage")).to_have_text("6 / 8 GiB", timeout=120_000)
    # The row says the kernel is idle (the kernel's own report of its cells).
    expect(panel.locator(f"{ROW} .jp-gpushare-idle")).to_have_text(re.compile(r"^idle "))

    def drawn() -> Any:
        panel = reopen(page)
        chart = panel.locator(CHART)
        expect(chart).to_have_count(1)
        return chart

    def risen() -> Any:
        """The chart once the used line has left the axis (the slice held, 6G in use, a while)."""
        chart = drawn()
        used = chart.locator(".jp-gpushare-usage-used").get_attribute("d") or ""
        return chart if last_of(used) < 62.5 else None

    chart = wait_for(risen, timeout=60, what="the used line to rise", page=page)
    expect(usage.locator(".jp-gpushare-usage-summary")).to_contain_text("GiB·h reserved")
    expect(usage.locator(".jp-gpushare-usage-top")).to_have_text(re.compile(r"^\d+G$"))
    expect(chart).to_have_attribute("aria-label", re.compile("reserved and used over the last day"))
    reserved = chart.locator(".jp-gpushare-usage-reserved").get_attribute("d") or ""
    used = chart.locator(".jp-gpushare-usage-used").get_attribute("d") or ""
    height = float((chart.get_attribute("viewBox") or "0 0 0 64").split()[3])
    # The last step holds the slice: the area rises off the axis there, the used line too.
    assert last_of(reserved) < height - 1, reserved
    assert last_of(used) < height - 1, used
    assert last_of(reserved) <= last_of(used)  # reserved at least what is used

    light = chart.locator(".jp-gpushare-usage-used").evaluate("path => getComputedStyle(path).stroke")
    page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
    )
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    dark_chart = drawn()
    dark = dark_chart.locator(".jp-gpushare-usage-used").evaluate("path => getComputedStyle(path).stroke")
    background = dark_chart.evaluate("svg => getComputedStyle(svg).backgroundColor")
    page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})"
    )
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'")
    assert light != dark, (light, dark)  # the theme's colours, not fixed ones
    assert background != "rgb(255, 255, 255)", background
