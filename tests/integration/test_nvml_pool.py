"""A real ``jupyter server`` on an NVML pool: the simulated ``libnvidia-ml.so.1``
(tests/support/nvml_sim) found by name on ``LD_LIBRARY_PATH``, as a machine with NVIDIA's driver
has it, and read through the real ``pynvml`` by the inventory and the usage monitor.

The other integration tests run on a simulated pool (``JUPYTER_GPUSHARE_SIMULATE``), whose usage
is what kernels declare; here nothing is declared: the server learns what a kernel's process
holds on a card from NVML, as on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpushare.core.sizes import GiB, MiB

from ..support.nodes import Node
from ..support.nvml_sim import SimulatedCard, SimulatedProcess, driver_root, write_state
from ..support.polling import async_wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
H200 = SimulatedCard(
    "GPU-5e1c0d3a-9b7f-4a2e-8c61-0d4f2b9a7e10", "NVIDIA H200", 143_771 * MiB, memory_reserved=615 * MiB
)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return write_state(tmp_path / "nvml-state", [H200])


@pytest.fixture
def server(node: Node, state: Path) -> Iterator[JupyterServer]:
    # No simulated pool: the server asks NVML, which is the simulated driver.
    running = start_server(
        node, extra_env={"JUPYTER_GPUSHARE_SIMULATE": "", **driver_root().environment(state)}
    )
    yield running
    running.stop()


async def test_a_kernels_gpu_memory_is_what_nvml_says_its_process_holds(
    server: JupyterServer, state: Path
) -> None:
    pool = server.request("GET", f"{API}/pool").body
    (device,) = pool["devices"]
    assert (device["uuid"], device["name"]) == (H200.uuid, "NVIDIA H200")
    assert device["memory_total"] == 143_156 * MiB  # the driver's reserve is not offered
    assert not pool["simulated"]

    reply = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g"})
    assert reply.status == 201, reply
    kernel_id = str(reply.body["kernel_id"])
    try:
        out, err = await execute(server, kernel_id, "import os; print(os.getpid())")
        assert not err, err
        held = SimulatedProcess(int(out), 3 * GiB)
        write_state(state, [replace(H200, memory_used=3 * GiB, processes=(held,))])

        view = await async_wait_until(
            lambda: server.request("GET", f"{API}/kernels/{kernel_id}").body, 60,
            message="the server measuring the kernel's 3G through NVML",
            until=lambda view: view["memory_used"] == 3 * GiB,
        )  # fmt: skip
        assert view["usage_source"] == "nvml"
    finally:
        server.request("DELETE", f"/api/kernels/{kernel_id}")
