"""Fixtures of the browser tests: one ``jupyter lab`` and one Chromium for the session, a fresh
page (and a reset workspace, no kernels, no notebooks) for every test.

Missing prerequisites fail the tests with what to install; they are never skipped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .lab import (
    VIEWPORT,
    Lab,
    SetupError,
    chromium,
    installed_extension,
    launch_browser,
    open_lab,
    start_lab,
)


def require(check: Any) -> Any:
    """``check()``, or a failure (never a skip) saying what to install."""
    try:
        return check()
    except SetupError as error:
        problem = str(error)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def extension() -> Path:
    return Path(require(installed_extension))


@pytest.fixture(scope="session")
def browser(extension: Path) -> Iterator[Any]:
    require(chromium)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None:
        pytest.fail(
            "the browser tests need the `playwright` package: pip install -e '.[test]'", pytrace=False
        )
    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def lab(extension: Path) -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-"))
    server = start_lab(root)
    yield server
    server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: Any, lab: Lab) -> Iterator[Any]:
    """JupyterLab in a new browser context, after the previous test's kernels and notebooks went."""
    if lab.process is None or lab.process.poll() is not None:
        lab.start()
    lab.reset()
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    page = context.new_page()
    messages: list[str] = []
    page.on("console", lambda message: messages.append(f"[{message.type}] {message.text}"))
    page.on("pageerror", lambda error: messages.append(f"[pageerror] {error}"))
    open_lab(page, lab)
    yield page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        shot = Path(os.environ.get("GPUSHARE_UI_ARTIFACTS", lab.root)) / f"{request.node.name}.png"
        try:
            page.screenshot(path=str(shot))
        except Exception as error:  # the page may be gone; the log below still helps
            shot = Path(f"(no screenshot: {error})")
        print(f"screenshot: {shot}\nbrowser console:\n" + "\n".join(messages[-40:]))
        print("jupyter lab log (tail):\n" + lab.log()[-4000:])
    context.close()
