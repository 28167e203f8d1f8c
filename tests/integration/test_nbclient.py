"""A notebook run by nbclient on a gpushare kernelspec gets its slice and leaves nothing behind."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_gpushare.core.sizes import GiB

from ..support.nodes import Node

pytestmark = pytest.mark.integration


async def test_nbclient_runs_a_notebook_and_leaves_nothing_reserved(node: Node) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import os\nprint(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])"),
        nbformat.v4.new_code_cell("print(os.environ['CUDA_VISIBLE_DEVICES'])"),
    ]
    seen_during_run: list[int] = []

    client = NotebookClient(notebook, kernel_name="python3-gpu-4g", timeout=60)
    client.on_cell_executed = lambda **_: seen_during_run.append(node.reserved())
    await client.async_execute()

    assert notebook.cells[0].outputs[0]["text"].strip() == str(4 * GiB)
    assert notebook.cells[1].outputs[0]["text"].strip() == node.ledger.devices()[0].uuid
    assert seen_during_run == [4 * GiB, 4 * GiB]
    assert node.ledger.records() == []
