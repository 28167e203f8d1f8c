"""NVML inside a kernel pod on the real node: the container toolkit's stand-in
(tests/cluster/nvidia_runtime.py, runc's wrapper under the node's containerd) gives a container
that NVIDIA's device plugin allocated a card the simulated driver's ``libnvidia-ml.so.1``, which
shows the container only its own card; a kernel whose pod holds its card whole (``exclusive``)
reports what NVML says that card uses, live, and the server shows it (``GET kernels``, ``%gpu
status``). Two whole cards on the node, with different use, so that a kernel reading the other
card's figure (or the sum of both) cannot pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane, KubeCluster
from ..cluster.gpu_node import GpuNode, gpu_node
from ..cluster.nodes import gfd_labels
from ..cluster.nvidia_device_plugin import write_config
from ..cluster.real_node import RealNode
from ..support.nodes import Node
from ..support.nvml_sim import SimulatedCard, write_state
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute
from .conftest import MakeKube
from .kubernetes_server.support import get, listed_by_jupyter_server, running_view
from .kubernetes_server.support import start as start_kernel
from .test_kubernetes import nothing_left
from .test_real_node_kernels import real_node_server

pytestmark = pytest.mark.integration

CARDS = (
    SimulatedCard("GPU-5e0c1a2b-0000-4000-8000-0000000000a1", "NVIDIA A100-SXM4-80GB", 80 * GiB, 3 * GiB),
    SimulatedCard("GPU-5e0c1a2b-0000-4000-8000-0000000000b2", "NVIDIA A100-SXM4-80GB", 80 * GiB, 7 * GiB),
)


@pytest.fixture(scope="module")
def gpu(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuNode]:
    """The real node with two whole cards (NVIDIA's device plugin without sharing)."""
    workdir = tmp_path_factory.mktemp("real-nvml-node")
    with gpu_node(
        control_plane,
        workdir,
        CARDS,
        write_config(workdir / "device-plugin.yaml"),
        ("nvidia.com/gpu", len(CARDS)),
        labels=gfd_labels(memory_mib=CARDS[0].memory_total // 2**20, count=len(CARDS)),
    ) as node:
        yield node


@pytest.fixture(scope="module")
def real_node(gpu: GpuNode) -> RealNode:
    return gpu.node  # make_kube(real_node=True) takes it from here


@pytest.fixture
def kube(make_kube: MakeKube) -> KubeCluster:
    return make_kube([], real_node=True)


@pytest.fixture
def server(node: Node, kube: KubeCluster) -> Iterator[JupyterServer]:
    started = real_node_server(node, kube)
    yield started
    started.stop()


def kernel_view(server: JupyterServer, kernel_id: str) -> dict[str, Any]:
    return dict(get(server, f"kernels/{kernel_id}"))


async def test_a_whole_card_kernel_reports_what_nvml_in_its_container_says_its_card_uses(
    server: JupyterServer, kube: KubeCluster, gpu: GpuNode
) -> None:
    body = {"name": "python3-gpu-16g", "path": "work/nvml.ipynb", "gpu_mode": "exclusive"}
    kernel_id = (await asyncio.to_thread(start_kernel, server, body))["kernel_id"]
    await asyncio.to_thread(running_view, server, kernel_id, 300)
    await asyncio.to_thread(listed_by_jupyter_server, server, kernel_id)
    # Inside the container: the library the wrapper mounted, one card, the one the plugin gave.
    code = (
        "import os, pynvml\n"
        "pynvml.nvmlInit()\n"
        "handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]\n"
        "print(os.environ['NVIDIA_VISIBLE_DEVICES'], [pynvml.nvmlDeviceGetUUID(h) for h in handles])\n"
    )
    out, errors = await execute(server, kernel_id, code, timeout=120)
    assert errors == "", errors
    visible, seen = out.split(" ", 1)
    [mine] = [card for card in CARDS if card.uuid == visible]
    assert seen.strip() == repr([mine.uuid]), out

    # The kernel's own report, every sample interval: its card's use, not the other card's.
    view = await asyncio.to_thread(
        wait_until,
        lambda: kernel_view(server, kernel_id),
        120,
        0.5,
        f"the kernel reporting {mine.memory_used} bytes used",
        until=lambda view: view.get("memory_used") == mine.memory_used,
    )
    assert view["usage_source"] == "kernel"
    # Live: the driver's figure changes (a rename over the state file), the report follows.
    cards = [
        SimulatedCard(card.uuid, card.name, card.memory_total, 11 * GiB if card is mine else card.memory_used)
        for card in CARDS
    ]
    write_state(gpu.state, cards)
    await asyncio.to_thread(
        wait_until,
        lambda: kernel_view(server, kernel_id).get("memory_used"),
        120,
        0.5,
        "the kernel reporting 11 GiB used",
        until=lambda used: used == 11 * GiB,
    )
    out, errors = await execute(server, kernel_id, "%gpu status", timeout=120)
    assert errors == "" and f"in pod {pod_name(kernel_id)}" in out and "Used: 11G of " in out, out

    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204, stopped.body
    await nothing_left(kube)
    write_state(gpu.state, CARDS)
