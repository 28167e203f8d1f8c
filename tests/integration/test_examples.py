"""Every example notebook runs under nbclient, on its own kernelspec as ``make demo`` installs it,
on a simulated pool, and leaves nothing reserved."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ..support.nodes import BIN, Node
from ..support.servers import free_port

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


def test_make_demo_leaves_pytorch_out() -> None:
    """The PyTorch notebook installs it where it is missing (below): the demo does not."""
    from importlib.metadata import requires

    demo = [r for r in requires("jupyter-gpushare") or [] if "extra" not in r or 'extra == "lab"' in r]
    assert demo and not [r for r in demo if r.startswith("torch")]


def python_without_pytorch(root: Path) -> Path:
    """A Python environment with every package of this one but PyTorch's: a virtual environment
    whose site directory links to each of this environment's packages, PyTorch's left out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True)
    python = root / "env" / "bin" / "python"
    packages = root / "packages"
    packages.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if re.split(r"[-.]", entry.name)[0].lower() not in ("torch", "torchgen", "functorch"):
            (packages / entry.name).symlink_to(entry)
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    # A site directory of its own: its .pth files (the editable install's) are read too.
    (Path(found.stdout.strip()) / "packages.pth").write_text(
        f"import site; site.addsitedir({str(packages)!r})\n"
    )
    return python


async def test_the_pytorch_notebook_skips_its_loop_in_one_line_where_pytorch_cannot_be_had(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without PyTorch, where the package index pip uses has none and nothing else can
    be reached: the notebook says so in one line and runs to its end, without a traceback."""
    prefix = Path(node.env["JUPYTER_PATH"]).parents[1]
    subprocess.run(demo_kernelspec_command(prefix), check=True, capture_output=True, env=node.env)
    notebook = nbformat.read(REPO / "examples" / "notebooks" / "03-pytorch-under-a-cap.ipynb", as_version=4)
    spec_file = prefix / "share" / "jupyter" / "kernels" / notebook.metadata.kernelspec.name / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["argv"][0] = str(python_without_pytorch(tmp_path))
    spec_file.write_text(json.dumps(spec))
    # The index pip uses (PyPI, or whatever it is set up with) lacks PyTorch; every other address,
    # such as PyTorch's own index, is unreachable (a proxy where nothing listens).
    (tmp_path / "index").mkdir()
    nowhere = f"http://127.0.0.1:{free_port()}"
    for name, value in {
        "PIP_INDEX_URL": (tmp_path / "index").as_uri(),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "HTTP_PROXY": nowhere,
        "HTTPS_PROXY": nowhere,
        "http_proxy": nowhere,
        "https_proxy": nowhere,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    await NotebookClient(notebook, timeout=300).async_execute()  # raises on a cell's error
    said = [
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    ]
    skipped = [
        line for text in said for line in text.splitlines() if "PyTorch could not be installed" in line
    ]
    assert len(skipped) == 1, said
    assert re.fullmatch(
        r"PyTorch could not be installed \([^\x1b]+\): the training loop below is skipped\.", skipped[0]
    )
    assert "final loss=" not in "".join(said)
    last = notebook.cells[-1].outputs
    assert "GPU slice: 4G (timeslice)" in last[0]["data"]["text/plain"], last  # %gpu, at the end
    assert node.ledger.records() == []
