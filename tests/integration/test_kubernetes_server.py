"""A jupyter server on the Kubernetes backend: the cluster as its pool, kernel pods as its slices.

A real ``jupyter server`` process talks to the emulated API server (list + watch) and starts
real kernels in pods the simulated node runs as local processes. What the tests read is what
the panel reads: ``GET pool``, ``GET kernels``, and what ``%gpu`` prints inside a pod kernel.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpushare.errors import DoesNotFitError
from jupyter_gpushare.k8s.cluster import Cluster, load_configuration
from jupyter_gpushare.k8s.manifests import APP, APP_LABEL, pod_name, secret_name
from jupyter_gpushare.k8s.watch import ClusterWatch
from jupyter_gpushare.sizes import GiB, MiB

from ..json_http import json_call
from .conftest import IMAGE, NAMESPACE, Node
from .k8s_sim import NODES, PODS, SimNode, SimulatedCluster, hami_nodes
from .kernels import write_kernelspec
from .servers import JupyterServer, Response, execute, start_server
from .test_kubernetes import manager, nothing_left
from .test_openapi import Contract, load_document
from .test_rest_api import metrics

pytestmark = pytest.mark.integration


def server_for(
    node: Node,
    cluster: SimulatedCluster,
    name: str = "k8s",
    provisioner: dict[str, Any] | None = None,
    **gpushare: str,
) -> JupyterServer:
    config = Path(node.env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    config.write_text(json.dumps({"KubernetesProvisioner": {"poll_interval": 0.1, **(provisioner or {})}}))
    environment = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "JUPYTER_GPUSHARE_BACKEND": "kubernetes",
        "JUPYTER_GPUSHARE_RESOURCE_PRESET": "hami",
        "JUPYTER_GPUSHARE_KERNEL_IMAGE": IMAGE,
        "JUPYTER_GPUSHARE_OWNER": "alice",
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.2",
        **{f"JUPYTER_GPUSHARE_{key.upper()}": value for key, value in gpushare.items()},
    }
    return start_server(node, name, environment)


@pytest.fixture
def server(node: Node, cluster: SimulatedCluster) -> Iterator[JupyterServer]:
    started = server_for(node, cluster)
    yield started
    started.stop()


def until(read: Callable[[], Any], check: Callable[[Any], bool], timeout: float = 20, what: str = "") -> Any:
    """Read until ``check`` holds; the last value read, or fail with it."""
    deadline = time.monotonic() + timeout
    value = read()
    while not check(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or 'condition'} not reached in {timeout} s; last: {value!r}")
        time.sleep(0.1)
        value = read()
    return value


CONTRACT = Contract(load_document())


def get(server: JupyterServer, path: str) -> Any:
    """``GET api/gpushare/{path}``, checked against the OpenAPI document."""
    response = server.request("GET", f"/api/gpushare/{path}")
    assert response.status == 200, response.body
    route = "/kernels/{kernel_id}" if path.startswith("kernels/") else f"/{path}"
    return CONTRACT.check(response, route, "GET", 200)


def kernel_token(cluster: SimulatedCluster, kernel_id: str) -> str:
    [secret] = [s for s in cluster.secrets() if s["metadata"]["name"] == secret_name(kernel_id)]
    return base64.b64decode(secret["data"]["token"]).decode()


def kernel_call(server: JupyterServer, kernel_id: str, route: str, body: Any, token: str) -> tuple[int, Any]:
    """A call to a kernel pod's own routes, as the kernel makes it (its token, no server login)."""
    answer = Response(
        *json_call(
            f"{server.url}/api/gpushare/kernels/{kernel_id}/{route}",
            "GET" if body is None else "POST",
            body,
            headers={"X-GPUShare-Token": token},
            timeout=30,
        )
    )
    CONTRACT.check(answer, "/kernels/{kernel_id}/" + route, "GET" if body is None else "POST")
    return answer.status, answer.body


def start(server: JupyterServer, body: dict[str, Any]) -> dict[str, Any]:
    started = server.request("POST", "/api/gpushare/kernels", body)
    assert started.status in (201, 202), started.body
    return dict(CONTRACT.check(started, "/kernels", "POST"))


def running_view(server: JupyterServer, kernel_id: str, timeout: float = 30) -> dict[str, Any]:
    return dict(
        until(
            lambda: server.request("GET", f"/api/gpushare/kernels/{kernel_id}").body,
            lambda view: isinstance(view, dict) and view.get("state") == "running",
            timeout,
            f"kernel {kernel_id} running",
        )
    )


# ---- the pool ----------------------------------------------------------------------------------


def test_the_watch_lists_then_follows_nodes_and_kernel_pods(cluster: SimulatedCluster) -> None:
    api = Cluster(NAMESPACE, configuration=load_configuration().configuration)
    changes: list[int] = []
    watch = ClusterWatch(api, on_change=lambda: changes.append(1)).start()
    try:
        assert watch.wait_synced(10) and watch.problem is None
        until(lambda: len(watch.nodes.items()), lambda n: n == 4, 10, "four nodes")
        assert watch.pods.items() == []
        kernel = {"metadata": {"name": "k", "namespace": NAMESPACE, "labels": {APP_LABEL: APP}}}
        other = {"metadata": {"name": "web", "namespace": NAMESPACE, "labels": {APP_LABEL: "web"}}}
        # Pods for a scheduler the simulated node does not play: they stay as they are.
        elsewhere = {"schedulerName": "elsewhere"}
        cluster.add(PODS, {**other, "spec": {**elsewhere, "containers": [{"name": "web", "image": "nginx"}]}})
        cluster.add(
            PODS, {**kernel, "spec": {**elsewhere, "containers": [{"name": "kernel", "image": IMAGE}]}}
        )
        until(lambda: [p["metadata"]["name"] for p in watch.pods.items()], lambda n: n == ["k"], 10, "pod k")
        before = watch.version
        cluster.remove(PODS, NAMESPACE, "k")
        until(lambda: watch.pods.items(), lambda items: items == [], 10, "pod k gone")
        assert watch.version > before and changes
    finally:
        watch.stop()
        api.close()


def test_a_watch_that_cannot_reach_the_api_says_why_and_keeps_trying() -> None:
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    api = Cluster(NAMESPACE, configuration=configuration)
    watch = ClusterWatch(api).start()
    try:
        # Nodes and pods are watched by two threads; either may report first.
        problem = until(
            lambda: watch.problem, lambda problem: "watch nodes" in (problem or ""), 10, "the nodes' problem"
        )
        assert "cannot reach the Kubernetes API to watch nodes" in problem
        assert not watch.nodes.synced.is_set()
    finally:
        watch.stop()
        api.close()


def test_the_pool_is_the_clusters_gpu_nodes_and_follows_them(
    server: JupyterServer, cluster: SimulatedCluster
) -> None:
    pool = until(lambda: get(server, "pool"), lambda p: len(p["devices"]) == 4, what="four nodes")
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

    # A node joins with time-slicing (GPU Feature Discovery labels): the watch shows it.
    cluster.add(
        NODES,
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
        ).manifest(),
    )
    pool = until(lambda: get(server, "pool"), lambda p: len(p["devices"]) == 5, timeout=10, what="5 nodes")
    joined = pool["devices"][4]
    assert joined["name"] == "2× NVIDIA L4 on gpu-node-5"
    assert joined["cards"] == 2 and joined["sharing"] == "time-slicing"
    assert joined["memory_total"] == 2 * 23034 * MiB
    assert joined["modes"] == ["timeslice"]
    assert joined["allocatable"] == {"nvidia.com/gpu": "8"}  # cpu is not a GPU resource


def test_without_a_cluster_the_pool_says_why(node: Node, cluster: SimulatedCluster) -> None:
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


# ---- a kernel pod through the REST API ------------------------------------------------------------


async def test_a_pod_kernel_started_through_the_servers_own_api_answers_over_its_websocket(
    server: JupyterServer, cluster: SimulatedCluster
) -> None:
    """The stock path: POST /api/kernels, the browser's websocket (the server's ZMQ sockets to the
    pod use the Curve keys), DELETE /api/kernels."""
    started = await asyncio.to_thread(server.request, "POST", "/api/kernels", {"name": "gpu-6g-vgpu"})
    assert started.status == 201, started.body
    kernel_id = started.body["id"]
    [pod] = cluster.pods()
    assert pod["metadata"]["name"] == pod_name(kernel_id)
    out, errors = await execute(server, kernel_id, "print(6 * 7)")
    assert (out, errors) == ("42\n", "")
    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204, stopped.body
    await nothing_left(cluster)


async def test_a_pod_kernel_waits_runs_reports_its_use_and_resizes_by_restart(
    server: JupyterServer, cluster: SimulatedCluster
) -> None:
    started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu", "path": "work/train.ipynb"})
    kernel_id = started["kernel_id"]
    if started["state"] == "queued":  # the pod is being scheduled and started
        assert started["detail"], started
        assert started["queue_position"] == 1
    view = await asyncio.to_thread(running_view, server, kernel_id)
    assert view["pod"] == pod_name(kernel_id)
    assert view["node"].startswith("gpu-node-")
    assert view["memory_request"] == 6 * GiB and view["size"] == "6G" and view["mode"] == "vgpu"
    assert view["path"] == "work/train.ipynb" and view["kernel_name"] == "gpu-6g-vgpu"
    assert view["detail"].startswith("running on gpu-node-")
    pool = get(server, "pool")
    device = pool["devices"][view["device"]]
    assert device["node"] == view["node"] and device["memory_reserved"] == 6 * GiB

    # The kernel in the pod reports its use to the server (declared here: no GPU on this machine).
    out, err = await execute(
        server,
        kernel_id,
        "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('5.5G')\ngpu.status()",
    )
    assert err == ""
    assert "GPU slice: 6G (vgpu) in pod " + pod_name(kernel_id) in out
    assert "Used: 5.5G of 6G (92%) [simulated]" in out
    view = get(server, f"kernels/{kernel_id}")
    assert view["memory_used"] == int(5.5 * GiB) and view["usage_source"] == "simulated"
    assert view["warnings"] == ["near its slice: using 5.5G of 6G (92%)"]
    assert get(server, "pool")["devices"][view["device"]]["memory_used"] == int(5.5 * GiB)
    series = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(await asyncio.to_thread(metrics, server))
        for sample in family.samples
    }
    labels = (("device", view["node"]), ("kernel_id", kernel_id), ("mode", "vgpu"), ("owner", "alice"))
    assert series["jupyter_gpushare_kernel_memory_used_bytes", labels] == int(5.5 * GiB)
    assert series["jupyter_gpushare_kernel_memory_request_bytes", labels] == 6 * GiB
    out, _ = await execute(server, kernel_id, "%gpu pool")
    assert "4 GPU node(s)" in out and "NVIDIA A100 SXM4 80GB on gpu-node-" in out

    # A pod's slice is fixed: resizing without a restart changes nothing, and says so.
    _, err = await execute(server, kernel_id, "%gpu resize 8G")
    assert "fixed for the pod's life: nothing was changed" in err
    _, err = await execute(server, kernel_id, "%gpu release")
    assert "keeps it for the pod's life" in err
    refused = server.request("PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G"})
    assert refused.status == 409 and "nothing was changed" in refused.body["message"]
    refused = server.request("DELETE", f"/api/gpushare/kernels/{kernel_id}/gpu")
    assert refused.status == 409 and "shut the kernel down" in refused.body["message"]
    assert get(server, f"kernels/{kernel_id}")["memory_request"] == 6 * GiB

    # With a restart (the panel's Resize on a pod): a new pod of the new size.
    old_uid = next(p for p in cluster.pods() if p["metadata"]["name"] == pod_name(kernel_id))["metadata"][
        "uid"
    ]
    resized = await asyncio.to_thread(
        server.request, "PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G", "restart": True}
    )
    assert resized.status == 200, resized.body
    view = await asyncio.to_thread(
        until,
        lambda: get(server, f"kernels/{kernel_id}"),
        lambda v: v["state"] == "running" and v["memory_request"] == 8 * GiB,
        30,
        "the 8G pod",
    )
    [pod] = [p for p in cluster.pods() if p["metadata"]["name"] == pod_name(kernel_id)]
    assert pod["metadata"]["uid"] != old_uid
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "8192"

    # And from inside the kernel: %gpu resize SIZE --restart asks the server for a new pod.
    out, err = await execute(server, kernel_id, "%gpu resize 10G --restart")
    assert "restarting kernel" in out and "10G" in out, err
    await asyncio.to_thread(
        until,
        lambda: get(server, f"kernels/{kernel_id}"),
        lambda v: v["state"] == "running" and v["memory_request"] == 10 * GiB,
        40,
        "the 10G pod",
    )
    out, _ = await execute(server, kernel_id, "print(6 * 7)")
    assert out == "42\n"

    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204
    await nothing_left(cluster)
    assert get(server, "kernels") == []


async def test_an_unschedulable_pod_shows_the_schedulers_reason_then_fails(
    node: Node, tmp_path: Path
) -> None:
    """Four nodes with 80 GiB cards whose vGPU memory is half promised elsewhere: a 60G slice
    fits a card, so it is asked for, and the scheduler says why it cannot be placed."""
    busy_nodes = hami_nodes(4, gpumem_mib=40960)
    write_kernelspec(node, "gpu-60g-vgpu", {"gpu_memory": "60G", "gpu_mode": "vgpu"})
    with SimulatedCluster(tmp_path / "busy", NAMESPACE, nodes=busy_nodes) as cluster:
        await _unschedulable(node, cluster)
        assert cluster.violations == []


async def _unschedulable(node: Node, cluster: SimulatedCluster) -> None:
    server = await asyncio.to_thread(server_for, node, cluster, "k8s-wait", {"unschedulable_grace": 4.0})
    try:
        await asyncio.to_thread(
            until, lambda: get(server, "pool"), lambda p: len(p["devices"]) == 4, 10, "four nodes"
        )
        # Larger than any card: refused before anything is made.
        refused = server.request(
            "POST", "/api/gpushare/kernels", {"name": "gpu-60g-vgpu", "gpu_memory": "200G"}
        )
        assert (refused.status, refused.body["message"]) == (
            409,
            "200G does not fit on any GPU node of the cluster: the largest card has 80G",
        )
        assert cluster.pods() == []
        started = await asyncio.to_thread(start, server, {"name": "gpu-60g-vgpu"})
        kernel_id = started["kernel_id"]
        assert started["state"] == "queued"
        reason = "0/4 nodes are available: 4 Insufficient nvidia.com/gpumem."
        view = await asyncio.to_thread(
            until,
            lambda: get(server, f"kernels/{kernel_id}"),
            lambda v: v.get("detail") == f"pending: {reason}",
            10,
            "the scheduler's reason",
        )
        assert view["state"] == "queued" and view["queue_position"] == 1
        assert view["memory_request"] == 60 * GiB
        [entry] = get(server, "pool")["queue"]
        assert entry["kernel_id"] == kernel_id and entry["reason"] == reason
        failed = await asyncio.to_thread(
            until,
            lambda: server.request("GET", f"/api/gpushare/kernels/{kernel_id}"),
            lambda response: response.status != 200,
            20,
            "the start to fail",
        )
        assert failed.status == 409
        assert reason in failed.body["message"] and "nvidia.com/gpumem=61440" in failed.body["message"]
        await nothing_left(cluster)
        assert get(server, "pool")["queue"] == []

        # A resize by restart into a size the cluster cannot place comes back with the old size.
        small = await asyncio.to_thread(start, server, {"name": "gpu-60g-vgpu", "gpu_memory": "6G"})
        kernel_id = small["kernel_id"]
        await asyncio.to_thread(running_view, server, kernel_id)
        refused = await asyncio.to_thread(
            server.request,
            "PATCH",
            f"/api/gpushare/kernels/{kernel_id}",
            {"gpu_memory": "60G", "restart": True},
        )
        assert refused.status == 409, refused.body
        assert refused.body["message"].startswith("the resize to 60G failed: the cluster cannot place")
        assert reason in refused.body["message"]
        assert refused.body["message"].endswith("; the kernel restarted with its previous size")
        view = await asyncio.to_thread(running_view, server, kernel_id)
        assert view["memory_request"] == 6 * GiB
        assert view["warnings"] and view["warnings"][0].startswith("the resize to 60G failed")
        [pod] = cluster.pods()
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "6144"
        out, _ = await execute(server, kernel_id, "print(6 * 7)")
        assert out == "42\n"
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        await nothing_left(cluster)
    finally:
        await asyncio.to_thread(server.stop)


async def test_the_per_user_limit_counts_every_kernel_pod_of_the_user(
    node: Node, cluster: SimulatedCluster
) -> None:
    server = await asyncio.to_thread(server_for, node, cluster, "k8s-quota", max_memory_per_user="10G")
    try:
        first = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
        await asyncio.to_thread(running_view, server, first["kernel_id"])
        refused = server.request("POST", "/api/gpushare/kernels", {"name": "gpu-6g-vgpu"})
        assert refused.status == 409
        assert refused.body["message"] == (
            "6G would take alice to 12G, above the per-user limit of 10G "
            "(6G already held by their kernel pods)"
        )
        # Another process of the same user (a second server, a console) is held to it too.
        kernels = manager(max_memory_per_user="10G")
        with pytest.raises(DoesNotFitError, match="would take alice to 12G"):
            await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
        assert len(cluster.pods()) == 1
        small = await kernels.start_kernel(kernel_name="gpu-6g-vgpu", gpu_memory="4G")
        await kernels.shutdown_kernel(small)
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{first['kernel_id']}")
        await nothing_left(cluster)
    finally:
        await asyncio.to_thread(server.stop)


# ---- the kernel's own routes ------------------------------------------------------------------


async def test_only_the_kernel_itself_reports_and_bad_reports_change_nothing(
    server: JupyterServer, cluster: SimulatedCluster
) -> None:
    started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
    kernel_id = started["kernel_id"]
    await asyncio.to_thread(running_view, server, kernel_id)
    token = kernel_token(cluster, kernel_id)
    report = {"memory_used": 2 * GiB, "utilization": 40, "source": "kernel"}

    assert kernel_call(server, kernel_id, "usage", report, "not-the-token")[0] == 403
    assert kernel_call(server, "no-such-kernel", "usage", report, token)[0] == 404
    bad_reports: list[Any] = [
        [],
        {"memory_used": -1},
        {"memory_used": "2G"},
        {"memory_used": True},
        {"memory_used": 1, "utilization": 101},
        {"memory_used": 1, "source": "nvml"},
    ]
    for bad in bad_reports:
        status, body = kernel_call(server, kernel_id, "usage", bad, token)
        assert status == 400 and body["message"], bad
    for bad_resize in ({}, {"gpu_memory": None}, {"gpu_memory": "8G", "restart": True}, ["8G"]):
        status, body = kernel_call(server, kernel_id, "resize", bad_resize, token)
        assert status == 400 and body["message"], bad_resize
    patched = server.request(
        "PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G", "restart": "yes"}
    )
    assert (patched.status, patched.body["message"]) == (400, 'restart must be true or false, not "yes"')
    status, body = kernel_call(server, kernel_id, "resize", {"gpu_memory": "abc"}, token)
    assert status == 400 and "cannot read GPU size 'abc'; accepted forms" in body["message"]
    status, body = kernel_call(server, kernel_id, "resize", {"gpu_memory": "100G"}, token)
    assert (status, body["message"]) == (
        409,
        "100G does not fit on any GPU node of the cluster: the largest card has 80G",
    )
    view = get(server, f"kernels/{kernel_id}")
    assert view["usage_source"] is None and view["memory_used"] == 0
    assert view["memory_request"] == 6 * GiB

    assert kernel_call(server, kernel_id, "usage", report, token)[0] == 204
    view = get(server, f"kernels/{kernel_id}")
    assert (view["memory_used"], view["utilization"], view["usage_source"]) == (2 * GiB, 40, "kernel")
    status, own = kernel_call(server, kernel_id, "self", None, token)
    assert (
        status == 200 and own["kernel"]["kernel_id"] == kernel_id and own["pool"]["backend"] == "kubernetes"
    )
    # The server's users need the server's login for the kernel routes' data, the kernel its token.
    assert kernel_call(server, kernel_id, "self", None, server.token)[0] == 403

    await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    await nothing_left(cluster)


class Metrics(BaseHTTPRequestHandler):
    """A HAMi-style monitor: per-container vGPU memory, labelled with the pod."""

    text = ""

    def do_GET(self) -> None:
        body = self.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


async def test_hami_metrics_give_the_use_of_kernels_that_do_not_report(
    node: Node, cluster: SimulatedCluster
) -> None:
    monitor = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=monitor.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{monitor.server_address[1]}/metrics"
    server = await asyncio.to_thread(server_for, node, cluster, "k8s-hami", usage_metrics_url=url)
    try:
        started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
        kernel_id = started["kernel_id"]
        await asyncio.to_thread(running_view, server, kernel_id)
        Metrics.text = (
            "# HELP vGPU_device_memory_usage_in_bytes vGPU device usage\n"
            "# TYPE vGPU_device_memory_usage_in_bytes gauge\n"
            f'vGPU_device_memory_usage_in_bytes{{ctrname="kernel",podname="{pod_name(kernel_id)}",'
            f'podnamespace="kernels",vdeviceid="0",deviceuuid="GPU-1"}} {3 * GiB}\n'
            f'vGPU_device_memory_usage_in_bytes{{ctrname="x",podname="other-pod",podnamespace="kernels"}} 1\n'
        )
        view = await asyncio.to_thread(
            until,
            lambda: get(server, f"kernels/{kernel_id}"),
            lambda v: v["usage_source"] == "hami",
            15,
            "HAMi's figure",
        )
        assert view["memory_used"] == 3 * GiB
        Metrics.text = "this is { not metrics"
        pool = await asyncio.to_thread(
            until, lambda: get(server, "pool"), lambda p: "problem" in p, 15, "the metrics problem"
        )
        assert f"cannot read GPU usage from {url}" in pool["problem"]
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        await nothing_left(cluster)
    finally:
        await asyncio.to_thread(server.stop)
        monitor.shutdown()


# ---- the command line ----------------------------------------------------------------------------


async def test_status_reads_the_cluster_on_the_kubernetes_backend(
    cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
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
        assert "Kernel pods in namespace kernels" in text
        assert f"{kernel_id}  alice  6G vgpu  {pod_name(kernel_id)}" in text
    finally:
        await kernels.shutdown_all()
    await nothing_left(cluster)


async def test_browsers_reconnect_when_their_kernel_comes_back_in_a_new_pod(
    server: JupyterServer, cluster: SimulatedCluster
) -> None:
    """A new pod has a new address and new ports: the server closes the kernel's websockets, so a
    browser reconnects (JupyterLab does so by itself) and gets channels to the new pod."""
    from tornado.websocket import websocket_connect

    started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
    kernel_id = started["kernel_id"]
    await asyncio.to_thread(running_view, server, kernel_id)
    url = f"{server.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels?token={server.token}"
    browser = await websocket_connect(url)
    resized = await asyncio.to_thread(
        server.request, "PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G", "restart": True}
    )
    assert resized.status == 200, resized.body
    while await asyncio.wait_for(browser.read_message(), 10) is not None:
        pass  # status messages until the server closes the connection
    out, _ = await execute(server, kernel_id, "print(6 * 7)")  # a reconnecting client
    assert out == "42\n"
    await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    await nothing_left(cluster)
