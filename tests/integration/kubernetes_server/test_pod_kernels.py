"""Kernel pods through the server's REST API: started, run over the websocket, resized by
restart, refused with the scheduler's reason or the per-user limit, and reconnected to when a
kernel comes back in a new pod."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, DoesNotFitError
from jupyter_gpushare.core.sizes import GiB

from ...cluster import KubeCluster, hami_nodes
from ...support.kernels import write_kernelspec
from ...support.nodes import Node
from ...support.polling import wait_until
from ...support.servers import JupyterServer, execute
from ..conftest import MakeKube
from ..test_kubernetes import manager, nothing_left
from ..test_rest_api import metrics
from .support import POLL, get, running_view, server_for, start

pytestmark = pytest.mark.integration


async def test_a_pod_kernel_started_through_the_servers_own_api_answers_over_its_websocket(
    server: JupyterServer, kube: KubeCluster
) -> None:
    """The stock path: POST /api/kernels, the browser's websocket (the server's ZMQ sockets to the
    pod use the Curve keys), DELETE /api/kernels."""
    started = await asyncio.to_thread(server.request, "POST", "/api/kernels", {"name": "gpu-6g-vgpu"})
    assert started.status == 201, started.body
    kernel_id = started.body["id"]
    [pod] = kube.pods()
    assert pod["metadata"]["name"] == pod_name(kernel_id)
    out, errors = await execute(server, kernel_id, "print(6 * 7)")
    assert (out, errors) == ("42\n", "")
    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204, stopped.body
    await nothing_left(kube)


async def test_a_pod_kernel_waits_runs_reports_its_use_and_resizes_by_restart(
    server: JupyterServer, kube: KubeCluster
) -> None:
    started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu", "path": "work/train.ipynb"})
    kernel_id = started["kernel_id"]
    if started["state"] == "queued":  # the pod is being scheduled, or bound and starting
        assert started["detail"], started
        # First in the cluster's queue while unbound; kube-scheduler may have bound it already
        # (then it waits for its container, and no longer stands in the queue).
        assert started["queue_position"] == (None if started["node"] else 1), started
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
    # The reclaimer's sweep may also have seen the kernel unused between this test's clients
    # (each execute opens and closes one): that warning is its own, and not the one checked here.
    near = "near its slice: using 5.5G of 6G (92%)"
    others = [warning for warning in view["warnings"] if warning != near]
    assert near in view["warnings"], view["warnings"]
    assert all(other.startswith("no notebook or console uses this kernel") for other in others), others
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
    for command in ("%gpu release", "%gpu suspend", "%gpu resume"):
        _, err = await execute(server, kernel_id, command)
        assert POD_HOLDS_ITS_GPU in err
    refused = server.request("PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G"})
    assert refused.status == 409 and "nothing was changed" in refused.body["message"]
    refused = server.request("DELETE", f"/api/gpushare/kernels/{kernel_id}/gpu")
    assert refused.status == 409 and POD_HOLDS_ITS_GPU in refused.body["message"]
    refused = server.request("POST", f"/api/gpushare/kernels/{kernel_id}/suspend")
    assert refused.status == 409 and POD_HOLDS_ITS_GPU in refused.body["message"]
    assert get(server, f"kernels/{kernel_id}")["memory_request"] == 6 * GiB

    # With a restart (the panel's Resize on a pod): a new pod of the new size.
    old_uid = next(p for p in kube.pods() if p["metadata"]["name"] == pod_name(kernel_id))["metadata"]["uid"]
    resized = await asyncio.to_thread(
        server.request, "PATCH", f"/api/gpushare/kernels/{kernel_id}", {"gpu_memory": "8G", "restart": True}
    )
    assert resized.status == 200, resized.body
    view = await asyncio.to_thread(
        wait_until,
        lambda: get(server, f"kernels/{kernel_id}"),
        120,
        POLL,
        "the 8G pod",
        until=lambda v: v["state"] == "running" and v["memory_request"] == 8 * GiB,
    )
    [pod] = [p for p in kube.pods() if p["metadata"]["name"] == pod_name(kernel_id)]
    assert pod["metadata"]["uid"] != old_uid
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "8192"

    # And from inside the kernel: %gpu resize SIZE --restart asks the server for a new pod.
    out, err = await execute(server, kernel_id, "%gpu resize 10G --restart")
    assert "restarting kernel" in out and "10G" in out, err
    await asyncio.to_thread(
        wait_until,
        lambda: get(server, f"kernels/{kernel_id}"),
        120,
        POLL,
        "the 10G pod",
        until=lambda v: v["state"] == "running" and v["memory_request"] == 10 * GiB,
    )
    out, _ = await execute(server, kernel_id, "print(6 * 7)")
    assert out == "42\n"

    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204
    await nothing_left(kube)
    assert get(server, "kernels") == []


async def test_an_unschedulable_pod_shows_the_schedulers_reason_then_fails(
    node: Node, make_kube: MakeKube
) -> None:
    """Four nodes with 80 GiB cards whose vGPU memory is half promised elsewhere: a 60G slice
    fits a card, so it is asked for, and kube-scheduler says why it cannot be placed."""
    write_kernelspec(node, "gpu-60g-vgpu", {"gpu_memory": "60G", "gpu_mode": "vgpu"})
    await _unschedulable(node, make_kube(hami_nodes(4, gpumem_mib=40960)))


async def _unschedulable(node: Node, kube: KubeCluster) -> None:
    server = await asyncio.to_thread(server_for, node, kube, "k8s-wait", {"unschedulable_grace": 4.0})
    try:
        await asyncio.to_thread(
            wait_until,
            lambda: get(server, "pool"),
            10,
            POLL,
            "four nodes",
            until=lambda p: len(p["devices"]) == 4,
        )
        # Larger than any card: refused before anything is made.
        refused = server.request(
            "POST", "/api/gpushare/kernels", {"name": "gpu-60g-vgpu", "gpu_memory": "200G"}
        )
        assert (refused.status, refused.body["message"]) == (
            409,
            "200G does not fit on any GPU node of the cluster: the largest card has 80G",
        )
        assert kube.pods() == []
        started = await asyncio.to_thread(start, server, {"name": "gpu-60g-vgpu"})
        kernel_id = started["kernel_id"]
        assert started["state"] == "queued"
        # kube-scheduler's own sentence: why no node fits, then why preemption would not help
        # (1.34: "… no new claims to deallocate, preemption: …").
        first = "0/4 nodes are available: 4 Insufficient nvidia.com/gpumem."
        preemption = "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."

        def schedulers(reason: str) -> bool:
            return reason.startswith(first) and reason.endswith(preemption)

        view = await asyncio.to_thread(
            wait_until,
            lambda: get(server, f"kernels/{kernel_id}"),
            60,
            POLL,
            "the scheduler's reason",
            until=lambda v: schedulers(v.get("detail", "").removeprefix("pending: ")),
        )
        assert view["state"] == "queued" and view["queue_position"] == 1
        assert view["memory_request"] == 60 * GiB
        [entry] = get(server, "pool")["queue"]
        assert entry["kernel_id"] == kernel_id and schedulers(entry["reason"]), entry
        assert view["detail"] == f"pending: {entry['reason']}"
        failed = await asyncio.to_thread(
            wait_until,
            lambda: server.request("GET", f"/api/gpushare/kernels/{kernel_id}"),
            60,
            POLL,
            "the start to fail",
            until=lambda response: response.status != 200,
        )
        assert failed.status == 409
        message = failed.body["message"]
        assert f"(asked for nvidia.com/gpu=1, nvidia.com/gpumem=61440): {first}" in message, message
        assert message.endswith(preemption), message
        await nothing_left(kube)
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
        assert first in refused.body["message"] and preemption in refused.body["message"]
        assert refused.body["message"].endswith("; the kernel restarted with its previous size")
        view = await asyncio.to_thread(running_view, server, kernel_id)
        assert view["memory_request"] == 6 * GiB
        assert view["warnings"] and view["warnings"][0].startswith("the resize to 60G failed")
        [pod] = kube.pods()
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "6144"
        out, _ = await execute(server, kernel_id, "print(6 * 7)")
        assert out == "42\n"
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        await nothing_left(kube)
    finally:
        await asyncio.to_thread(server.stop)


async def test_the_per_user_limit_counts_every_kernel_pod_of_the_user(node: Node, kube: KubeCluster) -> None:
    server = await asyncio.to_thread(server_for, node, kube, "k8s-quota", max_memory_per_user="10G")
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
        assert len(kube.pods()) == 1
        small = await kernels.start_kernel(kernel_name="gpu-6g-vgpu", gpu_memory="4G")
        await kernels.shutdown_kernel(small)
        await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{first['kernel_id']}")
        await nothing_left(kube)
    finally:
        await asyncio.to_thread(server.stop)


async def test_browsers_reconnect_when_their_kernel_comes_back_in_a_new_pod(
    server: JupyterServer, kube: KubeCluster
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
    await nothing_left(kube)


async def test_an_idle_pod_restarts_in_a_new_pod_only_where_the_admin_opted_in(
    node: Node, kube: KubeCluster
) -> None:
    server = await asyncio.to_thread(server_for, node, kube, idle_release_after="1", idle_pod_restart="True")
    try:
        started = await asyncio.to_thread(start, server, {"name": "gpu-6g-vgpu"})
        kernel_id = started["kernel_id"]
        await asyncio.to_thread(running_view, server, kernel_id)
        [pod] = [p for p in kube.pods() if p["metadata"]["name"] == pod_name(kernel_id)]
        await execute(server, kernel_id, "x = 1")  # the idle clock starts with the first cell
        # Idle for 1 s: the kernel asks its server, which restarts it in a new pod (x is lost).
        await asyncio.to_thread(
            wait_until,
            lambda: [
                p["metadata"]["uid"] for p in kube.pods() if p["metadata"]["name"] == pod_name(kernel_id)
            ],
            60,
            POLL,
            "a new pod",
            until=lambda uids: bool(uids) and uids != [pod["metadata"]["uid"]],
        )
        await asyncio.to_thread(running_view, server, kernel_id, 60)
    finally:
        await asyncio.to_thread(server.stop)
