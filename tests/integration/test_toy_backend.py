"""A third backend kind from another package: a real Jupyter server starts a kernel through it.

The toy kind (tests/toy_backend/toy_gpushare) is installed as packages are: its distribution's
metadata, with an ``entry_points.txt`` naming its kind under ``jupyter_gpushare.backends``, on the
path of the server and of its kernels. Nothing of jupyter_gpushare is changed for it: the
registry finds it, ``c.GPUShare.backend = "toy"`` chooses it, the server holds its backend,
``gpushare-provisioner`` builds its provisioner, and the kernel's ``%gpu status`` shows its slice.
docs/development.md ("Adding a backend") walks through the same steps.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

TOY_PACKAGE = Path(__file__).resolve().parents[1] / "toy_backend"


def install_toy_kind(site: Path) -> str:
    """The toy kind's distribution in ``site`` (a directory the processes put on their path), as
    pip would leave it; the PYTHONPATH that finds it and its code."""
    dist_info = site / "toy_gpushare-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-gpushare\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[jupyter_gpushare.backends]\ntoy = toy_gpushare:KIND\n")
    return os.pathsep.join([str(site), str(TOY_PACKAGE)])


@pytest.fixture
def toy_server(node: Node) -> Iterator[JupyterServer]:
    path = install_toy_kind(node.root / "site-packages")
    server = start_server(node, "toy", {"PYTHONPATH": path, "JUPYTER_GPUSHARE_BACKEND": "toy"})
    yield server
    server.stop()


async def test_a_kernel_starts_through_a_kind_another_package_registers(
    node: Node, toy_server: JupyterServer
) -> None:
    pool = toy_server.request("GET", "/api/gpushare/pool")
    assert pool.status == 200 and pool.body["backend"] == "toy", pool.body

    started = toy_server.request("POST", "/api/kernels", {"name": "python3-gpu-4g"})
    assert started.status == 201, started.body
    kernel_id = started.body["id"]
    try:
        # The toy's provisioner started it (it marks its kernels), with a slice from its pool.
        out, err = await execute(
            toy_server, kernel_id, "import os; print(os.environ.get('TOY_GPUSHARE_KERNEL'))"
        )
        assert out.strip() == kernel_id, (out, err)
        [record] = node.running()
        assert record.kernel_id == kernel_id and record.memory == 4 * 2**30

        out, err = await execute(toy_server, kernel_id, "%gpu status")
        assert "GPU slice: 4G (timeslice) on GPU0" in out, (out, err)
        # The kernel found its handle through the kind its provisioner named, and reaches its
        # slice through the toy's own backend (before: always the local one).
        out, err = await execute(
            toy_server,
            kernel_id,
            "from jupyter_gpushare.kernel.slice_handle import slice_handle\n"
            "handle = slice_handle(); print(type(handle).__name__, handle.backend.name)",
        )
        assert out.strip() == "NodeSliceHandle toy", (out, err)
    finally:
        assert toy_server.request("DELETE", f"/api/kernels/{kernel_id}").status == 204
    wait_until(lambda: not node.running(), timeout=60, message="the toy kernel's slice given back")


def test_the_doctor_runs_the_kinds_own_checks(node: Node) -> None:
    path = install_toy_kind(node.root / "site-packages")
    result = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "doctor", "--no-kernel"],
        env={**node.env, "PYTHONPATH": path, "JUPYTER_GPUSHARE_BACKEND": "toy"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "OK    toy: the toy kind answers" in result.stdout, result.stdout + result.stderr


def test_without_the_package_the_kind_is_unknown(node: Node) -> None:
    result = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "status"],
        env={**node.env, "JUPYTER_GPUSHARE_BACKEND": "toy"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "unknown backend 'toy': the installed kinds are kubernetes, local" in result.stderr
