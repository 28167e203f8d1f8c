"""Every example notebook runs under nbclient on a simulated pool and leaves nothing reserved."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import Node

pytestmark = pytest.mark.integration

NOTEBOOKS = sorted((Path(__file__).parents[2] / "examples" / "notebooks").glob("*.ipynb"))


def test_the_examples_are_there() -> None:
    assert [path.name for path in NOTEBOOKS] == [
        "01-choose-a-size.ipynb",
        "02-magics-and-resize.ipynb",
        "03-pytorch-under-a-cap.ipynb",
        "04-over-limit-warning.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
async def test_example_notebook_runs(node: Node, path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=180, kernel_name="python3-gpu-4g")
    await client.async_execute()
    outputs = "\n".join(
        str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "Error" not in outputs, outputs
    if path.stem.startswith("02"):
        assert "1000G is larger than any GPU" in outputs and "GPU slice: 4G" in outputs
    if path.stem.startswith("03"):
        assert "final loss=" in outputs and "Cap: torch:" in outputs
    if path.stem.startswith("04"):
        assert "above its slice: using 5G of 4G (125%)" in outputs
    assert node.ledger.records() == []
