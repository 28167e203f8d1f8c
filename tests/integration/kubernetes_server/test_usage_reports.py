"""What a pod kernel uses, from its own reports (its token only, bad reports change nothing)
and from HAMi's per-container metrics for kernels that do not report."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name, secret_name
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU
from jupyter_gpushare.core.sizes import GiB

from ...cluster import KubeCluster
from ...support.json_http import json_call
from ...support.nodes import Node
from ...support.polling import wait_until
from ...support.servers import JupyterServer, Response
from ..test_kubernetes import nothing_left
from .support import CONTRACT, POLL, get, running_view, server_for, start

pytestmark = pytest.mark.integration


def kernel_token(kube: KubeCluster, kernel_id: str) -> str:
    [secret] = [s for s in kube.secrets() if s["metadata"]["name"] == secret_name(kernel_id)]
    return base64.b64decode(secret["data"]["token"]).decode()


def kernel_call(server: JupyterServer, kernel_id: str, route: str, body: Any, token: str) -> tuple[int, Any]:
    """A call to a kernel pod's own routes, as the kernel makes it (its token, no server login)."""
    answer = Response(
        *json_call(
            f"{server.url}/api/gpushare/kernels/{kernel_id}/{route}",
            "GET" if body is None else "POST",
            body,
            headers={"X-GPUShare-Token": token},
            timeout=120,
        )
    )
    CONTRACT.check(answer, "/kernels/{kernel_id}/" + route, "GET" if body is None else "POST")
    return answer.status, answer.body


async def test_only_the_kernel_itself_reports_and_bad_reports_change_nothing(
    server: JupyterServer, kube: KubeCluster
) -> None:
    started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
    kernel_id = started["kernel_id"]
    await asyncio.to_thread(running_view, server, kernel_id)
    token = kernel_token(kube, kernel_id)
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
    # An idle pod asks to give its memory back: only a new pod can, and only if the admin opted in.
    for bad_idle in ({}, {"idle_for": -1}, {"idle_for": "60"}, {"idle_for": 60, "now": True}):
        status, body = kernel_call(server, kernel_id, "idle", bad_idle, token)
        assert status == 400 and body["message"], bad_idle
    status, body = kernel_call(server, kernel_id, "idle", {"idle_for": 60}, token)
    assert (
        status == 409
        and POD_HOLDS_ITS_GPU in body["message"]
        and "idle_pod_restart is off" in body["message"]
    )
    # A cell's start and end: the kernel's token only, checked; a server without a broker keeps
    # no accounting, so nothing changes but the answer.
    cell = {"busy": True, "at": time.time(), "idle_after": 0, "idle_action": "release"}
    assert kernel_call(server, kernel_id, "activity", cell, "not-the-token")[0] == 403
    assert kernel_call(server, "no-such-kernel", "activity", cell, token)[0] == 404
    for bad_cell in (
        [],
        {"busy": "yes", "at": time.time()},
        {"busy": True},
        {"busy": True, "at": time.time() - 7200},
        {"busy": True, "at": time.time(), "idle_after": -1},
        {"busy": True, "at": time.time(), "idle_action": "sleep"},
    ):
        status, body = kernel_call(server, kernel_id, "activity", bad_cell, token)
        assert status == 400 and body["message"], bad_cell
    assert kernel_call(server, kernel_id, "activity", cell, token)[0] == 204
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
    await nothing_left(kube)


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


async def test_hami_metrics_give_the_use_of_kernels_that_do_not_report(node: Node, kube: KubeCluster) -> None:
    monitor = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=monitor.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{monitor.server_address[1]}/metrics"
    server = await asyncio.to_thread(server_for, node, kube, "k8s-hami", usage_metrics_url=url)
    try:
        started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
        kernel_id = started["kernel_id"]
        await asyncio.to_thread(running_view, server, kernel_id)
        Metrics.text = (
            "# HELP vGPU_device_memory_usage_in_bytes vGPU device usage\n"
            "# TYPE vGPU_device_memory_usage_in_bytes gauge\n"
            f'vGPU_device_memory_usage_in_bytes{{ctrname="kernel",podname="{pod_name(kernel_id)}",'
            f'podnamespace="{kube.namespace}",vdeviceid="0",deviceuuid="GPU-1"}} {3 * GiB}\n'
            "vGPU_device_memory_usage_in_bytes"
            f'{{ctrname="x",podname="other-pod",podnamespace="{kube.namespace}"}} 1\n'
        )
        view = await asyncio.to_thread(
            wait_until,
            lambda: get(server, f"kernels/{kernel_id}"),
            15,
            POLL,
            "HAMi's figure",
            until=lambda v: v["usage_source"] == "hami",
        )
        assert view["memory_used"] == 3 * GiB
        Metrics.text = "this is { not metrics"
        pool = await asyncio.to_thread(
            wait_until,
            lambda: get(server, "pool"),
            15,
            POLL,
            "the metrics problem",
            until=lambda p: "problem" in p,
        )
        assert f"cannot read GPU usage from {url}" in pool["problem"]
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        await nothing_left(kube)
    finally:
        await asyncio.to_thread(server.stop)
        monitor.shutdown()
