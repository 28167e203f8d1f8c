"""A real ``jupyter lab`` on a simulated 2-GPU pool, and Chromium driven by Playwright.

Shared by the browser tests (``tests/ui``) and ``scripts/screenshots.py``. The server runs
as a JupyterHub single-user server would: under a base URL (``/user/alice/``), with token
authentication, in isolated Jupyter directories with its own node ledger and the gpushare
kernelspecs installed. The browser is the system's Chromium (Debian's ``/usr/bin/chromium``,
``$CHROMIUM`` to override): Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config.kernelspecs import build_kernelspec, install_kernelspecs
from jupyter_gpushare.core.records import SliceRecord

from ..support.json_http import json_call
from ..support.polling import wait_until
from ..support.servers import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
BASE_URL = "/user/alice/"
VIEWPORT = {"width": 1280, "height": 800}
SIMULATE = "2xA100-80GB"
KERNEL_SIZES = ["4G", "8G", "16G"]
EXTENSION = "jupyter-gpushare"


class SetupError(RuntimeError):
    """Something the browser tests need is missing; the message says how to get it."""


# ---- the extension under test ------------------------------------------------------------------


def installed_extension() -> Path:
    """The extension as pip installed it (what JupyterLab loads), checked against the sources."""
    sys.path.insert(0, str(REPO / "labextension"))
    try:
        import build_hook
    finally:
        sys.path.pop(0)
    if not build_hook.up_to_date():
        raise SetupError(
            "the JupyterLab extension is not built from the present sources of labextension/: "
            "run `pip install -e .` (or `make install`), which builds it"
        )
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / EXTENSION
    if not (installed / "package.json").is_file():
        raise SetupError(f"the JupyterLab extension is not installed in {installed}: run `pip install -e .`")
    built = json.loads((build_hook.OUTPUT / "package.json").read_text())["jupyterlab"]["_build"]
    shipped = json.loads((installed / "package.json").read_text())["jupyterlab"]["_build"]
    if built != shipped:
        raise SetupError(
            f"the installed JupyterLab extension ({installed}) is older than the build in "
            f"{build_hook.OUTPUT}: run `pip install -e .` again"
        )
    return installed


def chromium() -> str:
    """The Chromium executable, or a SetupError saying how to install it."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        raise SetupError(
            f"the browser tests need Chromium at {CHROMIUM} (Debian: `apt-get install -y chromium`; "
            "elsewhere set $CHROMIUM to a Chromium or Chrome executable). Playwright's own browser "
            "downloads are not used."
        )
    return CHROMIUM


def launch_browser(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)


# ---- the server ---------------------------------------------------------------------------------


@dataclass
class Lab:
    """A running ``jupyter lab`` and what tests need to talk to it and check on it."""

    root: Path
    env: dict[str, str]
    port: int
    token: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    app: str = "jupyter-lab"  # or "jupyter-notebook": Notebook 7 on the same server extension

    @property
    def server_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{BASE_URL}"

    @property
    def notebook_dir(self) -> Path:
        return self.root / "notebooks"

    @property
    def ledger_path(self) -> Path:
        return Path(self.env["JUPYTER_GPUSHARE_LEDGER_PATH"])

    def lab_url(self, reset: bool = True) -> str:
        return f"{self.server_url}lab?{'reset&' if reset else ''}token={self.token}"

    def ledger(self) -> Ledger:
        return Ledger(self.ledger_path)

    def records(self) -> list[SliceRecord]:
        """Every row of the ledger: running slices and queued requests."""
        ledger = self.ledger()
        try:
            return ledger.records()
        finally:
            ledger.close()

    def slices(self) -> list[SliceRecord]:
        return [record for record in self.records() if record.state == "running"]

    def queued(self) -> list[SliceRecord]:
        return [record for record in self.records() if record.state == "queued"]

    def slice_of(self, kernel_id: str) -> SliceRecord | None:
        return next((record for record in self.slices() if record.kernel_id == kernel_id), None)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
        """One authenticated call to a route under the base URL, e.g. ``api/gpushare/pool``."""
        return call(self.server_url, self.token, method, path, body, timeout)

    def start(self) -> Lab:
        """Start (or restart, on the same port and directories) the server and wait for it."""
        self.log_path = self.root / f"lab-{int(time.time() * 1000)}.log"
        lab_only = (
            [
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.expose_app_in_browser=True",
            ]
            if self.app == "jupyter-lab"
            else ["--JupyterNotebookApp.expose_app_in_browser=True"]
        )
        self.process = subprocess.Popen(
            [
                str(BIN / self.app),
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.base_url={BASE_URL}",
                f"--IdentityProvider.token={self.token}",
                "--ServerApp.allow_root=True",
                f"--ServerApp.root_dir={self.notebook_dir}",
                *lab_only,
            ],
            env=self.env,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited:\n{self.log()}")
            try:
                if self.request("GET", "api/gpushare/pool", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer in 90 s:\n{self.log()}")

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def reset(self) -> None:
        """Shut down every session and kernel, and remove the notebooks: a clean slate."""
        status, sessions = self.request("GET", "api/sessions")
        for session in sessions if status == 200 else []:
            self.request("DELETE", f"api/sessions/{session['id']}")
        status, kernels = self.request("GET", "api/kernels")
        for kernel in kernels if status == 200 else []:
            self.request("DELETE", f"api/kernels/{kernel['id']}")
        wait_for(lambda: not self.slices(), timeout=30, what="the ledger to be empty")
        for path in self.notebook_dir.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def make_environment(root: Path, gpushare: dict[str, Any] | None = None) -> dict[str, str]:
    """Isolated Jupyter directories, a simulated 2-GPU pool, its own ledger, gpushare kernelspecs."""
    prefix = root / "prefix"
    paths = {
        "JUPYTER_CONFIG_DIR": root / "config",
        "JUPYTER_DATA_DIR": root / "data",
        "JUPYTER_RUNTIME_DIR": root / "runtime",
        "IPYTHONDIR": root / "ipython",
        "JUPYTERLAB_SETTINGS_DIR": root / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": root / "lab-workspaces",
    }
    for path in [*paths.values(), root / "notebooks"]:
        path.mkdir(parents=True, exist_ok=True)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("JUPYTER", "JPY_")) and name != "IPYTHONDIR"
    }
    env.update({name: str(path) for name, path in paths.items()})
    env.update(
        {
            "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
            "JUPYTER_PLATFORM_DIRS": "1",
            # The environment wins over the config file: a pool the test configures goes here.
            "JUPYTER_GPUSHARE_SIMULATE": (gpushare or {}).get("simulate", SIMULATE),
            "JUPYTER_GPUSHARE_LEDGER_PATH": str(root / "ledger.sqlite"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    # No news or update checks popping up over the page.
    notification = paths["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    settings = {"sample_interval": 0.25, **(gpushare or {})}
    (paths["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.json").write_text(
        json.dumps({"GPUShare": settings})
    )
    # "Python 3 (GPU)", whose size is picked at each start, and two of fixed sizes.
    install_kernelspecs(KERNEL_SIZES, prefix=str(prefix), asking=True)
    # A second mode, so the picker offers a choice of modes (a simulated pool accepts vgpu).
    install_kernelspecs(["4G"], mode="vgpu", prefix=str(prefix))
    return env


def start_lab(root: Path, gpushare: dict[str, Any] | None = None, app: str = "jupyter-lab") -> Lab:
    env = make_environment(root, gpushare)
    return Lab(root=root, env=env, port=free_port(), token="ui-test-token", app=app).start()


def start_other_user(lab: Lab, owner: str = "bob") -> subprocess.Popen[bytes]:
    """A second ``jupyter server`` of another user on the same ledger (a neighbour on the node)."""
    root = lab.root / f"{owner}-home"
    root.mkdir(exist_ok=True)
    env = dict(lab.env, JUPYTER_GPUSHARE_OWNER=owner)
    env["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    port = free_port()
    process = subprocess.Popen(
        [
            str(BIN / "jupyter-server"),
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={owner}",
            "--ServerApp.allow_root=True",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=(root / "server.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    process.url = f"http://127.0.0.1:{port}/"  # type: ignore[attr-defined]
    process.token = owner  # type: ignore[attr-defined]
    return process


def call(
    url: str, token: str, method: str, path: str, body: Any = None, timeout: float = 60
) -> tuple[int, Any]:
    return json_call(url + path, method, body, headers={"Authorization": f"token {token}"}, timeout=timeout)


def wait_for(
    condition: Callable[[], Any], timeout: float = 30, what: str = "the condition", page: Any = None
) -> Any:
    """Poll ``condition`` until it is true. Pass the ``page`` when the condition reads what its
    event handlers record: Playwright's sync API delivers events only while it runs, so the
    wait must go through the page rather than ``time.sleep``."""
    sleep = None if page is None else (lambda seconds: page.wait_for_timeout(seconds * 1000))
    return wait_until(condition, timeout, 0.1, what, sleep=sleep)


# ---- the page ------------------------------------------------------------------------------------


@contextlib.contextmanager
def lab_page(browser: Any, lab: Lab) -> Iterator[Any]:
    """JupyterLab on ``lab`` in a browser context of its own (closed afterwards, as a browser
    tab is), for a test with a server of its own."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        open_lab(page, lab)
        yield page
    finally:
        context.close()


def open_lab(page: Any, lab: Lab, reset: bool = True) -> None:
    """Load JupyterLab (a fresh workspace unless ``reset=False``) and wait until it is ready."""
    page.goto(lab.lab_url(reset=reset))
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=60_000)
    page.evaluate("() => window.jupyterapp.restored")
    # The launcher's cards come from the kernelspecs; wait for the gpushare ones.
    page.locator(".jp-LauncherCard", has_text="Python 3 (GPU)").first.wait_for(timeout=60_000)


def open_panel(page: Any) -> Any:
    """Show the GPU panel from its tab in the left sidebar; the panel's locator."""
    panel = page.locator("#jp-gpushare-panel")
    if not panel.is_visible():
        page.locator('.jp-SideBar [data-id="jp-gpushare-panel"]').click()
    panel.wait_for(state="visible")
    return panel


def gpu_card(size: str | None = None, mode: str = "timeslice") -> str:
    """The launcher card title (the display name) of a gpushare kernelspec: "Python 3 (GPU)"
    without a size; with one, its number is padded with hair spaces (launcher order)."""
    return str(build_kernelspec(size, mode)["display_name"])


def start_notebook(page: Any, kernel_label: str = "Python 3 (GPU)") -> None:
    """Click the launcher's notebook card of a kernelspec."""
    page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{kernel_label}"]').click()


def picker_dialog(page: Any, timeout: float = 60_000) -> Any:
    dialog = page.locator(".jp-Dialog:has(.jp-gpushare-picker)")
    dialog.wait_for(timeout=timeout)
    return dialog


def fit_note(dialog: Any, value: str) -> Any:
    """What the picker says a start of one choice (a preset, or "custom") would do now."""
    option = dialog.locator(".jp-gpushare-picker-option", has=dialog.page.locator(f'input[value="{value}"]'))
    return option.locator(".jp-gpushare-fit")


def kernel_name(page: Any) -> Any:
    """The current notebook's kernel name in its toolbar ("No Kernel" without one)."""
    return page.locator(".jp-NotebookPanel:visible .jp-Toolbar-kernelName").first


def change_kernel(page: Any, label: str) -> None:
    """Kernel › Change Kernel…, then choose ``label`` in JupyterLab's "Select Kernel" dialog."""
    page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:change-kernel') }")
    select = page.locator(".jp-Dialog", has_text="Select Kernel")
    select.locator("select").select_option(label=label)
    select.get_by_role("button", name="Select Kernel").click()


# The current notebook's kernel, connected and idle: a cell run before the notebook is
# connected to its kernel is not run at all (its text moves on, nothing executes).
_KERNEL_READY = """() => {
    const kernel = window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel;
    return kernel?.connectionStatus === 'connected' && kernel?.status === 'idle';
}"""


def wait_for_kernel(page: Any, timeout: float = 120_000) -> None:
    """Wait until the current notebook is connected to its kernel and the kernel is idle."""
    page.wait_for_function(_KERNEL_READY, timeout=timeout)


def run_cell(page: Any, code: str, *, wait_for_kernel_first: bool = True) -> None:
    """Type code in the current notebook's active cell and run it, once the notebook's kernel
    is connected and idle (``wait_for_kernel_first=False``: at once, for a start still waiting)."""
    if wait_for_kernel_first:
        wait_for_kernel(page)
    editor = page.locator(".jp-NotebookPanel:visible .jp-Cell.jp-mod-active .cm-content")
    typed = code.replace("\n", "")  # the editor's text: its lines' text run together
    # On a loaded machine a click can land before the editor takes keys, and the text is lost
    # (CI once ran an empty cell): type again, replacing whatever arrived, until it is there.
    for _ in range(6):
        editor.click()
        page.keyboard.press("ControlOrMeta+A")
        page.keyboard.insert_text(code)
        try:
            expect(editor).to_have_text(typed, timeout=10_000)
            break
        except AssertionError:
            continue
    expect(editor).to_have_text(typed)
    page.keyboard.press("Shift+Enter")
    # The key that runs it can be lost the same way: Shift+Enter makes the next cell the active
    # one at once (before the kernel answers), so an active cell still holding the text was not
    # run. (A cell that ran is never run twice: the check reads the notebook, not the kernel.)
    for _ in range(5):
        try:
            expect(editor).not_to_have_text(typed, timeout=10_000)
            return
        except AssertionError:
            editor.click()
            page.keyboard.press("Shift+Enter")
    expect(editor).not_to_have_text(typed)
