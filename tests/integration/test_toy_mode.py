"""A sixth sharing mode from another package: offered, started and rendered with nothing of
jupyter_gpushare changed.

The toy mode (tests/toy_mode/toy_mode) is installed as packages are: its distribution's metadata,
with an ``entry_points.txt`` naming it under ``jupyter_gpushare.modes``, on the path of the
server, of its kernels and of the command line. The picker's answers (``GET config``, ``GET
fit``) offer it, the served OpenAPI document lists it, a real server starts a real kernel in it
with the toy's own environment, ``%gpu request --mode toy`` takes it from inside a kernel, and
``jupyter gpushare render-pod --mode toy`` renders its pod in both Kubernetes dialects.
docs/development.md ("Adding a mode") walks through the same steps.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

TOY_PACKAGE = Path(__file__).resolve().parents[1] / "toy_mode"
API = "/api/gpushare"


def install_toy_mode(site: Path) -> str:
    """The toy mode's distribution in ``site`` (a directory the processes put on their path), as
    pip would leave it; the PYTHONPATH that finds it and its code."""
    dist_info = site / "toy_mode-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-mode\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[jupyter_gpushare.modes]\ntoy = toy_mode:ToyMode\n")
    return os.pathsep.join([str(site), str(TOY_PACKAGE)])


@pytest.fixture
def toy_path(node: Node) -> str:
    return install_toy_mode(node.root / "site-packages")


@pytest.fixture
def toy_server(node: Node, toy_path: str) -> Iterator[JupyterServer]:
    server = start_server(node, "toy-mode", {"PYTHONPATH": toy_path})
    yield server
    server.stop()


def render_pod(node: Node, path: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**node.env, "JUPYTER_GPUSHARE_OWNER": "alice"}
    if path is not None:
        env["PYTHONPATH"] = path
    return subprocess.run(
        [str(BIN / "jupyter-gpushare"), "render-pod", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def kernel_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "kernel")


async def test_the_picker_offers_a_mode_another_package_registers_and_a_kernel_starts_in_it(
    node: Node, toy_server: JupyterServer
) -> None:
    config = toy_server.request("GET", f"{API}/config")
    assert config.status == 200, config.body
    assert config.body["modes"] == ["exclusive", "mps", "timeslice", "toy", "vgpu"], config.body
    fits = toy_server.request("GET", f"{API}/fit?gpu_memory=4G&gpu_memory=96G&gpu_mode=toy")
    assert fits.status == 200, fits.body
    assert [fit["verdict"] for fit in fits.body] == ["now", "never"], fits.body
    [device] = toy_server.request("GET", f"{API}/pool").body["devices"]
    assert "toy" in device["modes"]
    served = toy_server.request("GET", f"{API}/openapi.yaml")
    assert served.status == 200
    document = yaml.safe_load(served.body)
    assert "toy" in document["components"]["schemas"]["Mode"]["enum"]

    started = toy_server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_mode": "toy"})
    assert started.status == 201, started.body
    assert (started.body["mode"], started.body["state"]) == ("toy", "running")
    kernel_id = started.body["kernel_id"]
    try:
        # The local kernel's environment is the toy's answer: its own variable, the caps.
        out, err = await execute(
            toy_server,
            kernel_id,
            "import os; print(os.environ['TOY_MODE_LIMIT_MIB'], os.environ['JUPYTER_GPUSHARE_MODE'], "
            "os.environ['CUPY_GPU_MEMORY_LIMIT'])",
        )
        limit, mode, cupy = out.split()
        assert (limit, mode) == ("4096", "toy"), (out, err)
        assert 0 < int(cupy) < 4 * 2**30
        [record] = node.running()
        assert (record.kernel_id, record.mode, record.memory) == (kernel_id, "toy", 4 * 2**30)

        # Inside the kernel, %gpu knows the mode too: its slice given back and taken again.
        out, err = await execute(toy_server, kernel_id, "%gpu release")
        assert "Released 4G." in out, (out, err)
        out, err = await execute(toy_server, kernel_id, "%gpu request 2G --mode toy")
        assert "GPU slice: 2G (toy)" in out, (out, err)
        [record] = node.running()
        assert (record.mode, record.memory) == ("toy", 2 * 2**30)
    finally:
        assert toy_server.request("DELETE", f"/api/kernels/{kernel_id}").status == 204
    wait_until(lambda: not node.running(), timeout=60, message="the toy kernel's slice given back")


def test_render_pod_renders_the_toy_modes_pod_in_both_dialects(node: Node, toy_path: str) -> None:
    plugins = render_pod(node, toy_path, "--mode", "toy", "--memory", "6G")
    assert plugins.returncode == 0, plugins.stderr
    pod = yaml.safe_load(plugins.stdout)
    kernel = kernel_container(pod)
    assert kernel["resources"] == {"limits": {"example.com/toy-gpu": "1"}}
    env = {item["name"]: item["value"] for item in kernel["env"]}
    assert (env["TOY_MODE_LIMIT_MIB"], env["JUPYTER_GPUSHARE_MODE"]) == ("6144", "toy")

    dra = render_pod(node, toy_path, "--mode", "toy", "--memory", "6G", "--preset", "hami-dra")
    assert dra.returncode == 0, dra.stderr
    pod, claim = yaml.safe_load_all(dra.stdout)
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == "hami-core-gpu.project-hami.io"
    assert request["capacity"] == {"requests": {"memory": "6Gi"}}
    env = {item["name"]: item["value"] for item in kernel_container(pod)["env"]}
    assert env["TOY_MODE_LIMIT_MIB"] == "6144"


def test_without_the_package_the_mode_is_refused(node: Node) -> None:
    refused = render_pod(node, None, "--mode", "toy")
    assert refused.returncode == 2
    assert "argument --mode: invalid choice: 'toy'" in refused.stderr, refused.stderr
