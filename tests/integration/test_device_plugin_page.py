"""docs/admins/kubernetes-device-plugin.md's time-slicing, as written, on the real node.

The page's time-slicing ConfigMap (its first ``yaml`` block, unmodified) is the config file of
NVIDIA's device plugin, built from its Go module and running over the simulated NVML on the
cluster's real node (Kubernetes' own kubelet on containerd and runc); the page's server settings
(its first ``python`` block, unmodified) are a real ``jupyter server``'s config file; the RBAC
the page asks for first is examples/kubernetes/rbac.yaml, applied with kubectl, and the server
acts as its ServiceAccount (the real RBAC decides). The kernel image the page names
(``registry.example.com/jupyter-gpushare-kernel:0.1.0``) is the image built from
examples/kubernetes/kernel-image's Dockerfile (tests/cluster/images.py), tagged so in the node's
containerd, as ``docker build -t`` would have named it: no registry is reachable here.

A fresh control plane of its own: rbac.yaml makes cluster-wide objects (namespaces) that other
modules' clusters must not see.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.core.framework_budget import framework_budget
from jupyter_gpushare.core.sizes import GiB

from ..cluster import PODS, SECRETS, ControlPlane
from ..cluster.gpu_node import gpu_node
from ..cluster.nodes import gfd_labels
from ..cluster.real_node import NODE_IP, RealNode
from ..cluster.rest import Identity
from ..support.nodes import Node
from ..support.nvml_sim import SimulatedCard
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, free_port, start_server
from .kubernetes_server.support import get, listed_by_jupyter_server, running_view
from .kubernetes_server.support import start as start_kernel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "admins" / "kubernetes-device-plugin.md"
RBAC = ROOT / "examples" / "kubernetes" / "rbac.yaml"
CARD = SimulatedCard("GPU-5e0c1a2b-0000-4000-8000-0000000d0c5a", "NVIDIA A100-SXM4-80GB", 80 * GiB)
SERVER_NAMESPACE, KERNELS_NAMESPACE = "jupyter", "jupyter-kernels"  # rbac.yaml's


def page_blocks(language: str) -> list[str]:
    """The page's fenced blocks of ``language``, in order."""
    tokens = MarkdownIt("commonmark").parse(PAGE.read_text(encoding="utf-8"))
    return [t.content for t in tokens if t.type == "fence" and t.info.split()[:1] == [language]]


@dataclass(frozen=True)
class PageCluster:
    plane: ControlPlane
    node: RealNode
    kubectl: Path
    shares: int  # how many nvidia.com/gpu.shared the page's config makes of the card


@pytest.fixture(scope="module")
def page_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageCluster]:
    root = tmp_path_factory.mktemp("device-plugin-page")
    config = yaml.safe_load(page_blocks("yaml")[0])
    [shared] = config["sharing"]["timeSlicing"]["resources"]
    # GPU Feature Discovery's labels for the card, as it labels a time-sliced node; the page's
    # node_selector picks the node by the last one.
    labels = gfd_labels(memory_mib=CARD.memory_total // 2**20, replicas=shared["replicas"])
    labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    (root / "device-plugin.yaml").write_text(page_blocks("yaml")[0])  # the page's, as written
    with (
        ControlPlane(root / "controlplane") as plane,
        gpu_node(
            plane,
            root / "gpu-node",
            [CARD],
            root / "device-plugin.yaml",
            ("nvidia.com/gpu.shared", shared["replicas"]),
            labels=labels,
            image_names=[page_kernel_image()],  # the page's `docker build -t`
        ) as gpu,
    ):
        kubectl = root / "bin" / "kubectl"
        kubectl.parent.mkdir()
        kubectl.symlink_to(plane.binary)
        yield PageCluster(plane, gpu.node, kubectl, int(shared["replicas"]))


def page_kernel_image() -> str:
    """The kernel image the page's settings name."""
    [line] = [line for line in page_blocks("python")[0].splitlines() if "kernel_image" in line]
    return str(line.split("=", 1)[1].strip().strip("\"'"))


@pytest.fixture
def server(page_cluster: PageCluster, node: Node, tmp_path: Path) -> Iterator[JupyterServer]:
    """A jupyter server with the page's settings as its config file, acting as rbac.yaml's
    ServiceAccount, listening where its kernel pods reach it (the node's address)."""
    plane = page_cluster.plane
    applied = subprocess.run(
        [str(page_cluster.kubectl), "apply", "-f", str(RBAC)],
        env={"KUBECONFIG": str(plane.admin_kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert applied.returncode == 0, applied.stderr
    token = plane.service_account_token(SERVER_NAMESPACE, "jupyter-gpushare")
    kubeconfig = plane.kubeconfig(
        tmp_path / "server.kubeconfig", Identity(plane.server, plane.ca, token=token), SERVER_NAMESPACE
    )
    (Path(node.env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.py").write_text(page_blocks("python")[0])
    port = free_port(NODE_IP)  # probed where it will listen
    started = start_server(
        node,
        "device-plugin-page",
        {"KUBECONFIG": str(kubeconfig), "JUPYTER_GPUSHARE_OWNER": "alice"},
        ip=NODE_IP,
        port=port,
    )
    yield started
    started.stop()


async def test_the_pages_time_slicing_runs_a_kernel_on_a_shared_card_of_the_real_node(
    page_cluster: PageCluster, server: JupyterServer
) -> None:
    plane, node = page_cluster.plane, page_cluster.node
    body = {"name": "python3-gpu-4g", "path": "page.ipynb", "gpu_memory": "4G"}
    kernel_id = (await asyncio.to_thread(start_kernel, server, body))["kernel_id"]
    view = await asyncio.to_thread(running_view, server, kernel_id, 300)
    assert view["node"] == node.name, view
    [pod] = plane.admin.list(PODS, KERNELS_NAMESPACE)
    assert pod["metadata"]["name"] == pod_name(kernel_id)
    assert pod["spec"]["nodeName"] == node.name
    assert pod["spec"]["serviceAccountName"] == "jupyter-gpushare-kernel"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    [kernel] = [c for c in pod["spec"]["containers"] if c["name"] == "kernel"]
    assert kernel["image"] == page_kernel_image()
    assert kernel["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    await asyncio.to_thread(listed_by_jupyter_server, server, kernel_id)
    # In the container: the page's user and group, the card the plugin allocated to the replica,
    # and the slice's soft cap that time-slicing leaves to the frameworks.
    code = (
        "import os, json\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
        "'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES'), "
        "'cupy': os.environ.get('CUPY_GPU_MEMORY_LIMIT'), "
        "'jax': os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION')}))\n"
    )
    out, errors = await execute(server, kernel_id, code, timeout=120)
    assert errors == ""
    seen = json.loads(out)
    # The page: CuPy's limit is the slice (less the CUDA context's share); JAX's fraction is
    # there because the card's size is known from GFD's nvidia.com/gpu.memory label.
    budget = framework_budget(4 * GiB)
    assert seen == {
        "uid": 1000,
        "gid": 100,
        "visible": CARD.uuid,
        "cupy": str(budget),
        "jax": f"{int(budget * 10_000 / CARD.memory_total) / 10_000:.4f}",
    }
    out, errors = await execute(server, kernel_id, "%gpu status", timeout=120)
    assert errors == "" and f"GPU slice: 4G (timeslice) in pod {pod_name(kernel_id)}" in out, out
    pool = get(server, "pool")
    assert [d["memory_reserved"] for d in pool["devices"] if d["node"] == node.name] == [4 * GiB]

    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204, stopped.body
    await asyncio.to_thread(
        wait_until,
        lambda: plane.admin.list(PODS, KERNELS_NAMESPACE) + plane.admin.list(SECRETS, KERNELS_NAMESPACE),
        120,
        0.5,
        "the kernel's pod and Secret gone",
        until=lambda left: left == [],
    )
