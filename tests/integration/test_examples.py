"""Every example notebook runs under nbclient, on its own kernelspec as ``make demo`` installs it,
on a simulated pool, and leaves nothing reserved."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ..support.nodes import BIN, Node

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]
NOTEBOOKS = sorted((REPO / "examples" / "notebooks").glob("*.ipynb"))


def demo_kernelspec_command(prefix: Path) -> list[str]:
    """The Makefile's ``demo`` recipe's kernelspec line, installing into ``prefix`` instead of
    the virtualenv every test shares: what ``make demo`` installs, nothing the tests add."""
    recipe = (REPO / "Makefile").read_text().partition("\ndemo:")[2]
    [line] = [line for line in recipe.splitlines() if "kernelspec install" in line]
    words = shlex.split(line.strip().replace("$(BIN)/", f"{BIN}/"))
    assert "--sys-prefix" in words, line
    return [*(w for w in words if w != "--sys-prefix"), "--prefix", str(prefix)]


def test_the_examples_are_there_and_as_make_notebooks_writes_them(tmp_path: Path) -> None:
    assert [path.name for path in NOTEBOOKS] == [
        "01-choose-a-size.ipynb",
        "02-magics-and-resize.ipynb",
        "03-pytorch-under-a-cap.ipynb",
        "04-over-limit-warning.ipynb",
    ]
    spec = importlib.util.spec_from_file_location("make_notebooks", REPO / "examples" / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    for written in maker.write(tmp_path):
        assert written.read_text() == (REPO / "examples" / "notebooks" / written.name).read_text(), (
            f"{written.name} differs from what examples/make_notebooks.py writes: run it"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
async def test_example_notebook_runs_on_the_demos_kernelspec(node: Node, path: Path) -> None:
    prefix = Path(node.env["JUPYTER_PATH"]).parents[1]
    subprocess.run(demo_kernelspec_command(prefix), check=True, capture_output=True, env=node.env)
    notebook = nbformat.read(path, as_version=4)
    kernelspec = notebook.metadata.kernelspec.name
    assert (prefix / "share" / "jupyter" / "kernels" / kernelspec / "kernel.json").is_file(), (
        f"{path.name} asks for kernelspec {kernelspec}, which make demo does not install"
    )
    client = NotebookClient(notebook, timeout=180)  # the notebook's own kernelspec
    await client.async_execute()
    outputs = "\n".join(
        str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "Error" not in outputs, outputs
    if path.stem.startswith("01"):
        assert "GPU slice: 4G (timeslice)" in outputs
    if path.stem.startswith("02"):
        assert "1000G is larger than any GPU" in outputs and "GPU slice: 4G" in outputs
    if path.stem.startswith("03"):
        assert "final loss=" in outputs and "Cap: torch:" in outputs
    if path.stem.startswith("04"):
        assert "above its slice: using 5G of 4G (125%)" in outputs
    assert node.ledger.records() == []


def test_the_pytorch_notebook_installs_pytorch_only_where_it_is_missing() -> None:
    """``make demo`` leaves PyTorch out; notebook 03's first cell installs it if missing (it is
    installed here, so the cell does nothing in the run above). Its command, as IPython would
    run it on a machine without a GPU and without PyTorch."""
    notebook = nbformat.read(REPO / "examples" / "notebooks" / "03-pytorch-under-a-cap.ipynb", as_version=4)
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert 'find_spec("torch") is None' in first.source
    [magic] = re.findall(r"^\s*%pip install (.*)$", first.source, re.MULTILINE)
    index = "--index-url https://download.pytorch.org/whl/cpu"
    assert magic.replace("{index}", index).split() == ["--quiet", "torch", *index.split()]
    from importlib.metadata import requires

    demo = [r for r in requires("jupyter-gpushare") or [] if "extra" not in r or 'extra == "lab"' in r]
    assert demo and not [r for r in demo if r.startswith("torch")]
