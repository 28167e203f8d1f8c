"""A first run as README and getting-started tell it (issue 25): what a checkout needs, and
``make demo``'s options reaching JupyterLab."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.json_http import json_call
from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]


def section(page: Path, title: str) -> str:
    text = page.read_text()
    return text.partition(f"\n## {title}\n")[2].partition("\n## ")[0]


@pytest.mark.parametrize(
    ("page", "title"), [("README.md", "Try it"), ("docs/getting-started.md", "Try it on any machine")]
)
def test_the_first_steps_name_what_a_checkout_needs(page: str, title: str) -> None:
    """Installing from a checkout builds the JupyterLab extension, which needs Node.js: the
    version the build asks for is the one the first steps name; no step installs from PyPI,
    where there is no release yet."""
    hook = (REPO / "labextension" / "build_hook.py").read_text()
    [needed] = re.findall(r"needs Node\.js (\d+)\+", hook)
    steps = section(REPO / page, title)
    assert f"Node.js {needed}+" in steps
    assert "git clone" in steps and "make demo" in steps
    whole = (REPO / page).read_text()
    assert "pip install jupyter-gpushare" not in whole


def demo_lab_command(port: int) -> list[str]:
    """What ``make demo PORT=… HEADLESS=1`` runs to start JupyterLab (installing nothing)."""
    made = subprocess.run(
        ["make", "-n", "-o", "install", "demo", f"PORT={port}", "HEADLESS=1", f"VENV={Path(sys.prefix)}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    joined = made.stdout.replace("\\\n", " ")
    [line] = [line for line in joined.splitlines() if "jupyter lab" in line]
    words = shlex.split(line)
    return [word for word in words if not word.startswith("JUPYTER_GPUSHARE_SIMULATE=")]


def test_make_demo_takes_a_port_and_runs_headless(node: Node) -> None:
    port = free_port()
    command = demo_lab_command(port)
    assert command[0] == str(BIN / "jupyter") and command[1] == "lab"
    assert f"--port={port}" in command and "--no-browser" in command
    log = node.root / "demo.log"
    process = subprocess.Popen(
        [*command, "--IdentityProvider.token=demo", "--ServerApp.port_retries=0", "--allow-root"],
        cwd=REPO,
        env={**node.env, "JUPYTER_GPUSHARE_SIMULATE": "1xT4-16GB"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        status = wait_until(
            lambda: _status(port), 90, 0.2, "the demo's JupyterLab to answer on its port", until=bool
        )
        assert status == 200, log.read_text()
        pool = json_call(
            f"http://127.0.0.1:{port}/api/gpushare/pool", "GET", headers={"Authorization": "token demo"}
        )[1]
        assert pool["simulated"] and [d["name"] for d in pool["devices"]] == ["Simulated T4-16GB"]
    finally:
        process.terminate()
        process.wait(timeout=60)


def _status(port: int) -> int | None:
    try:
        return json_call(
            f"http://127.0.0.1:{port}/api/status", "GET", headers={"Authorization": "token demo"}
        )[0]
    except OSError:
        return None
