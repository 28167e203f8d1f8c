"""The cluster as the server's pool: the watch of nodes and kernel pods, ``GET pool`` as nodes
join, the reason when there is no cluster, and ``jupyter gpushare status`` on the cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from jupyter_gpushare.backends.kubernetes.cluster.clients import SharedCluster
from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, load_configuration
from jupyter_gpushare.backends.kubernetes.cluster.watch import ClusterWatch
from jupyter_gpushare.backends.kubernetes.objects.manifests import APP, APP_LABEL, pod_name
from jupyter_gpushare.backends.kubernetes.objects.presets import PRESETS
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.sizes import GiB, MiB

from ...cluster import NODES, PODS, KubeCluster, SimNode
from ...support.nodes import IMAGE, Node
from ...support.polling import wait_until
from ...support.servers import JupyterServer, start_server
from ..conftest import MakeKube
from ..test_kubernetes import manager, nothing_left
from .support import POLL, get

pytestmark = pytest.mark.integration


def test_the_watch_lists_then_follows_nodes_and_kernel_pods(kube: KubeCluster) -> None:
    api = Cluster(kube.namespace, configuration=load_configuration().configuration)
    changes: list[int] = []
    watch = ClusterWatch(api, on_change=lambda: changes.append(1)).start()
    try:
        assert watch.wait_synced(10) and watch.problem is None
        wait_until(lambda: len(watch.nodes.items()), 60, POLL, "four nodes", until=lambda n: n == 4)
        assert watch.pods.items() == []
        kernel = {"metadata": {"name": "k", "labels": {APP_LABEL: APP}}}
        other = {"metadata": {"name": "web", "labels": {APP_LABEL: "web"}}}
        # Pods for a scheduler the cluster does not run: they stay pending, as they are.
        elsewhere = {"schedulerName": "elsewhere"}
        kube.add(PODS, {**other, "spec": {**elsewhere, "containers": [{"name": "web", "image": "nginx"}]}})
        kube.add(PODS, {**kernel, "spec": {**elsewhere, "containers": [{"name": "kernel", "image": IMAGE}]}})
        wait_until(
            lambda: [p["metadata"]["name"] for p in watch.pods.items()],
            10,
            POLL,
            "pod k",
            until=lambda names: names == ["k"],
        )
        before = watch.version
        kube.remove(PODS, kube.namespace, "k")
        wait_until(lambda: watch.pods.items(), 60, POLL, "pod k gone", until=lambda items: items == [])
        assert watch.version > before and changes
    finally:
        watch.stop()
        api.close()


def test_the_watched_nodes_are_read_once_per_change_and_a_kernel_pod_found_by_name(
    kube: KubeCluster,
) -> None:
    """A broker asks for the GPU nodes on every admission round and every start, and for one
    kernel pod on every ``GET pods/{id}``: 500 nodes take milliseconds to read, so they are read
    again only once the watch saw a node change, and a pod is looked up, not found among copies
    of all of them (issue 40)."""
    shared = SharedCluster(Cluster(kube.namespace, configuration=load_configuration().configuration))
    hami = PRESETS["hami"]
    try:
        watch = shared.watch()
        wait_until(lambda: len(shared.gpu_nodes(hami)), 60, POLL, "four nodes", until=lambda n: n == 4)

        def read_twice() -> tuple[list[NodeGPUs], list[NodeGPUs], bool]:
            version = watch.nodes.version
            first, second = shared.gpu_nodes(hami), shared.gpu_nodes(hami)
            return first, second, version == watch.nodes.version

        # Two reads with no node change between them (the control plane may update a node).
        first, second, _ = wait_until(
            read_twice, 60, POLL, "two reads of unchanged nodes", until=lambda r: r[2]
        )
        assert all(a is b for a, b in zip(first, second, strict=True))
        before = watch.nodes.version
        name = first[0].name
        kube.patch(NODES, name, {"metadata": {"labels": {"jupyter-gpushare.io/test-changed": "yes"}}})
        wait_until(lambda: watch.nodes.version, 60, POLL, "the node's change", until=lambda v: v > before)
        third = shared.gpu_nodes(hami)
        assert [node.name for node in third] == [node.name for node in first]
        assert third[0] is not first[0]

        kernel = {"metadata": {"name": "k", "labels": {APP_LABEL: APP}}}
        other = {"metadata": {"name": "web", "labels": {APP_LABEL: "web"}}}
        elsewhere = {"schedulerName": "elsewhere"}
        kube.add(PODS, {**other, "spec": {**elsewhere, "containers": [{"name": "web", "image": "nginx"}]}})
        kube.add(PODS, {**kernel, "spec": {**elsewhere, "containers": [{"name": "kernel", "image": IMAGE}]}})
        found = wait_until(lambda: shared.kernel_pod("k"), 30, POLL, "kernel pod k")
        assert found is not None and found["metadata"]["name"] == "k"
        assert shared.kernel_pod("web") is None  # a pod, but not a kernel pod: not watched
        assert shared.kernel_pod("nothing") is None
    finally:
        shared.stop()
        shared.cluster.close()


def test_a_watch_that_cannot_reach_the_api_says_why_and_keeps_trying() -> None:
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    api = Cluster("kernels", configuration=configuration)
    watch = ClusterWatch(api).start()
    try:
        # Nodes and pods are watched by two threads; either may report first.
        problem = wait_until(
            lambda: watch.problem, 60, POLL, "the nodes' problem", until=lambda p: "watch nodes" in (p or "")
        )
        assert "cannot reach the Kubernetes API to watch nodes" in problem
        assert not watch.nodes.synced.is_set()
    finally:
        watch.stop()
        api.close()


def test_the_pool_is_the_clusters_gpu_nodes_and_follows_them(
    server: JupyterServer, make_kube: MakeKube
) -> None:
    pool = wait_until(
        lambda: get(server, "pool"), 60, POLL, "four nodes", until=lambda p: len(p["devices"]) == 4
    )
    assert pool["backend"] == "kubernetes"
    assert "problem" not in pool
    first = pool["devices"][0]
    assert first["name"] == "NVIDIA A100 SXM4 80GB on gpu-node-1"
    assert first["node"] == "gpu-node-1"
    assert first["memory_total"] == 80 * GiB  # HAMi's allocatable nvidia.com/gpumem, in MiB
    assert first["memory_reserved"] == 0
    assert first["modes"] == ["vgpu"]
    assert first["allocatable"] == {
        "nvidia.com/gpu": "10",
        "nvidia.com/gpumem": "81920",
        "nvidia.com/gpucores": "100",
    }
    assert get(server, "config")["modes"] == ["vgpu"]

    # A node joins with time-slicing (GPU Feature Discovery labels), registered by its own
    # kubelet: the watch shows it.
    make_kube(
        [
            SimNode(
                "gpu-node-5",
                {"nvidia.com/gpu": "8", "cpu": "32"},
                {
                    "nvidia.com/gpu.product": "NVIDIA-L4",
                    "nvidia.com/gpu.memory": "23034",
                    "nvidia.com/gpu.count": "2",
                    "nvidia.com/gpu.sharing-strategy": "time-slicing",
                    "nvidia.com/gpu.replicas": "4",
                },
            )
        ]
    )
    pool = wait_until(
        lambda: get(server, "pool"), 60, POLL, "5 nodes", until=lambda p: len(p["devices"]) == 5
    )
    joined = pool["devices"][4]
    assert joined["name"] == "2× NVIDIA L4 on gpu-node-5"
    assert joined["cards"] == 2 and joined["sharing"] == "time-slicing"
    assert joined["memory_total"] == 2 * 23034 * MiB
    assert joined["modes"] == ["timeslice"]
    assert joined["allocatable"] == {"nvidia.com/gpu": "8"}  # cpu is not a GPU resource


def test_without_a_cluster_the_pool_says_why(node: Node) -> None:
    missing = node.root / "no-such-kubeconfig"
    config = Path(node.env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    config.write_text("{}")
    server = start_server(
        node,
        "no-cluster",
        {"KUBECONFIG": str(missing), "JUPYTER_GPUSHARE_BACKEND": "kubernetes", "HOME": str(node.root)},
    )
    try:
        pool = get(server, "pool")
        assert pool["devices"] == []
        assert "no Kubernetes configuration" in pool["problem"]
    finally:
        server.stop()


async def test_status_reads_the_cluster_on_the_kubernetes_backend(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_gpushare.cli import main

    monkeypatch.setenv("JUPYTER_GPUSHARE_BACKEND", "kubernetes")
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "hami")
    kernels = manager()
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    try:
        assert await asyncio.to_thread(main, ["status", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert [device["node"] for device in status["pool"]["devices"]] == [
            f"gpu-node-{i}" for i in range(1, 5)
        ]
        [kernel] = status["kernels"]
        assert (kernel["kernel_id"], kernel["state"], kernel["memory_request"]) == (
            kernel_id,
            "running",
            6 * GiB,
        )
        assert sum(device["memory_reserved"] for device in status["pool"]["devices"]) == 6 * GiB
        assert await asyncio.to_thread(main, ["status"]) == 0
        text = capsys.readouterr().out
        assert f"Kernel pods in namespace {kube.namespace}" in text
        assert f"{kernel_id}  alice  6G vgpu  {pod_name(kernel_id)}" in text
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)
