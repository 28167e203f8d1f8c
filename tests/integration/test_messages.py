"""What a newcomer reads (issue 25): a refused start under nbclient ends with its sentence, not a
traceback; a local kernel's traffic is encrypted as its environment says, with no warning."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import execute, start_server

pytestmark = pytest.mark.integration


def test_a_limit_refusal_under_nbclient_ends_with_its_sentence(node: Node, tmp_path: Path) -> None:
    """Failed before: the sentence, then a 20-line traceback logged by jupyter_client and
    Python's own 58-line traceback of the same refusal."""
    notebook = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3-gpu-4g", "display_name": "x", "language": "python"}}
    )
    notebook.cells = [nbformat.v4.new_code_cell("print(1)")]
    path = tmp_path / "limited.ipynb"
    nbformat.write(notebook, path)
    done = subprocess.run(
        [str(BIN / "jupyter"), "execute", str(path)],
        env={**node.env, "JUPYTER_GPUSHARE_MAX_MEMORY_PER_KERNEL": "2G"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert lines[-1] == "No kernel was started: 4G is above the per-kernel limit of 2G", lines
    assert len(lines) <= 3, lines  # the app's "Executing", the logged sentence, the last word
    assert node.ledger.records() == []


def connection(node: Node, kernel_id: str) -> dict[str, object]:
    path = Path(node.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"
    return dict(json.loads(wait_until(lambda: path.is_file() and path.read_text(), 60, message=str(path))))


@pytest.mark.parametrize("encrypt", [True, False])
def test_a_local_kernels_traffic_is_encrypted_as_its_environment_says(node: Node, encrypt: bool) -> None:
    """Failed before: on one user's machine the kernel's environment said encrypt=True while its
    traffic was plain, and ipykernel warned about it at every start."""
    node.write_server_config({"encrypt": encrypt})
    server = start_server(node)
    try:
        started = server.request("POST", "/api/gpushare/kernels", {"name": "python3-gpu-4g"})
        assert started.status == 201, started.body
        kernel_id = started.body["kernel_id"]
        keys = connection(node, kernel_id)
        assert bool(keys.get("curve_publickey")) is encrypt
        out, _ = asyncio.run(
            execute(server, kernel_id, "import os; print(os.environ['JUPYTER_GPUSHARE_ENCRYPT'])")
        )
        assert out.strip() == str(encrypt)
        assert ("running over TCP without encryption" in server.log()) is not encrypt
    finally:
        server.stop()
