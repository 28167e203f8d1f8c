"""Helpers: run code in a real kernel, write hand-made kernelspecs, wait for a process to end."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from traitlets.config import Config

from .nodes import Node
from .polling import wait_until

# Scripts a test starts as an OS process of its own: one kernel held until killed (the crash
# tests), N kernels started at once (the concurrency test).
STARTER = Path(__file__).with_name("starter.py")
MANY_STARTER = Path(__file__).with_name("many_starter.py")


def kernel_manager(config: Config | None = None) -> AsyncMultiKernelManager:
    """The kernel manager of a test: connection files go to the test's runtime directory.

    A plain ``AsyncMultiKernelManager`` writes ``kernel-<id>.json`` into the current directory
    (its ``connection_dir`` defaults to ""), and only a clean shutdown removes it: a test that is
    killed or fails mid-start would leave it in the repository. jupyter_server's manager uses the
    runtime directory; so do the tests (``JUPYTER_RUNTIME_DIR``, set by the ``node`` fixture).
    """
    return AsyncMultiKernelManager(config=config, connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])


@dataclass
class Cell:
    """What one execution produced."""

    stdout: str = ""
    stderr: str = ""
    result: str = ""  # text/plain of execute_result and display_data
    html: str = ""
    error: str | None = None  # exception name when the cell raised
    mimetypes: list[str] = field(default_factory=list)  # of each execute_result and display_data


async def run_cell(kernel: AsyncKernelManager, code: str, timeout: float = 60) -> Cell:
    """Execute ``code`` in ``kernel`` and collect its outputs."""
    client = kernel.client()
    client.start_channels()
    cell = Cell()
    try:
        await client.wait_for_ready(timeout=timeout)

        def collect(message: dict[str, Any]) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    cell.stdout += content["text"]
                else:
                    cell.stderr += content["text"]
            elif kind in ("execute_result", "display_data"):
                cell.result += content["data"].get("text/plain", "")
                cell.html += content["data"].get("text/html", "")
                cell.mimetypes.extend(content["data"])
            elif kind == "error":
                cell.error = content["ename"]

        await client.execute_interactive(code, output_hook=collect, timeout=timeout)
    finally:
        client.stop_channels()
    return cell


async def run_code(kernel: AsyncKernelManager, code: str, timeout: float = 30) -> str:
    """Execute ``code``, insist it succeeds, and return what it printed to stdout."""
    cell = await run_cell(kernel, code, timeout)
    assert cell.error is None, cell
    return cell.stdout


def write_kernelspec(node: Node, name: str, config: dict[str, object]) -> None:
    """A gpushare kernelspec written by hand, so it can hold values our installer refuses."""
    directory = Path(node.env["JUPYTER_PATH"]) / "kernels" / name
    directory.mkdir(parents=True)
    spec = {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name,
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpushare-provisioner", "config": config}},
    }
    (directory / "kernel.json").write_text(json.dumps(spec))


def wait_for_exit(pid: int, timeout: float = 20) -> None:
    """Wait until process ``pid`` has ended (gone, or a zombie its parent has yet to reap)."""
    wait_until(lambda: has_ended(pid), timeout, 0.1, f"the end of process {pid}")


def has_ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
