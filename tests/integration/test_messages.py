"""What a newcomer reads (issue 25): a refused start under nbclient ends with its sentence, not a
traceback. (Whether a local kernel's traffic is encrypted: test_kernel_encryption.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import nbformat
import pytest

from ..support.nodes import BIN, Node

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
