"""Notebook 7 (``jupyter notebook``) picks the GPU size before the kernel starts, as JupyterLab
does, and its picker shows a prepared pool as the server's allocator sees it.

The server has two simulated cards of different sizes, an A100-40GB and a T4-16GB, and presets
one of which no card can hold; kernels of another notebook fill part of each card.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import GiB

from .conftest import VIEWPORT
from .lab import Lab, fit_note, gpu_card, kernel_name, picker_dialog, start_lab, wait_for

pytestmark = pytest.mark.integration

PRESETS = ["2G", "8G", "24G", "whole", "64G"]
STARTED_WITHIN = 30_000  # ms


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.fixture(scope="module")
def notebook7() -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-nb7-"))
    server = start_lab(root, {"simulate": "1xA100-40GB,1xT4-16GB", "sizes": PRESETS}, app="jupyter-notebook")
    yield server
    server.stop()


@pytest.fixture
def nb7_page(browser: Any, notebook7: Lab) -> Iterator[Any]:
    notebook7.reset()
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


def open_notebook(page: Any, server: Lab, name: str, kernel: str) -> None:
    """A notebook saved with a gpushare kernelspec, opened in Notebook 7's notebook page."""
    notebook = {
        "cells": [],
        "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (server.notebook_dir / name).write_text(json.dumps(notebook))
    page.goto(f"{server.server_url}notebooks/{name}?token={server.token}")


def sessions(server: Lab) -> list[dict[str, Any]]:
    return list(server.request("GET", "api/sessions")[1])


def test_the_picker_shows_the_pool_and_the_kernel_starts_once_at_the_pick(
    nb7_page: Any, notebook7: Lab
) -> None:
    page, server = nb7_page, notebook7
    # 30G held on the A100 (10G left), 12G on the T4 (4G left).
    for size in ("30G", "12G"):
        status, body = server.request(
            "POST", "api/gpushare/kernels", {"name": "python3-gpu-4g", "gpu_memory": size}
        )
        assert status == 201, body

    open_notebook(page, server, "train.ipynb", "python3-gpu")
    dialog = picker_dialog(page)
    expect(dialog).to_contain_text("GPU for train.ipynb")
    expect(fit_note(dialog, "2G")).to_have_text("fits now on GPU1, 4G free")  # best fit: the T4
    expect(fit_note(dialog, "8G")).to_have_text("fits now on GPU0, 10G free")
    expect(fit_note(dialog, "24G")).to_have_text(re.compile(r"^queue position 1, wait "))
    expect(fit_note(dialog, "whole")).to_have_text(re.compile(r"^queue position 1, wait "))
    expect(fit_note(dialog, "64G")).to_have_text("larger than any card")
    # A preset no card can hold is refused with the server's reason; nothing has started.
    dialog.locator('input[value="64G"]').check()
    expect(dialog.get_by_role("button", name="Start")).to_be_disabled()
    expect(dialog.locator(".jp-gpushare-picker-message")).to_contain_text(
        "64G cannot start: 64G is larger than any GPU in the pool"
    )
    assert sessions(server) == []

    # Cancel: no kernel, nothing reserved beyond the two others, the notebook says "No Kernel".
    dialog.get_by_role("button", name="Cancel").click()
    expect(kernel_name(page)).to_have_text("No Kernel")
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert sessions(server) == [] and len(server.records()) == 2

    # Kernel › Change Kernel… asks again; 8G starts at once, on the A100.
    page.locator(".jp-Toolbar-kernelName").first.click()
    select = page.locator(".jp-Dialog", has_text="Select Kernel")
    select.locator("select").select_option(label=gpu_card())
    select.get_by_role("button", name="Select Kernel").click()
    dialog = picker_dialog(page)
    dialog.locator('input[value="8G"]').check()
    dialog.get_by_role("button", name="Start").click()
    expect(kernel_name(page)).to_have_text(gpu_card(), timeout=STARTED_WITHIN)
    [session] = wait_for(lambda: sessions(server), what="the notebook's session")
    held = server.slice_of(session["kernel"]["id"])
    assert held is not None and (held.memory, held.device_uuid) == (8 * GiB, server.records()[0].device_uuid)
