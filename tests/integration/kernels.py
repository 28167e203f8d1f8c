"""Helpers: run code in a real kernel, write hand-made kernelspecs, wait for a process to end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from .conftest import Node


async def run_code(kernel: AsyncKernelManager, code: str, timeout: float = 30) -> str:
    """Execute ``code`` and return everything it printed to stdout."""
    client = kernel.client()
    client.start_channels()
    output: list[str] = []
    try:
        await client.wait_for_ready(timeout=timeout)

        def collect(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                output.append(message["content"]["text"])

        reply = await client.execute_interactive(code, output_hook=collect, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    return "".join(output)


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs after {timeout} s")
