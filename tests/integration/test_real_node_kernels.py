"""A user's kernel in a real pod: a ``timeslice`` kernel started through a real ``jupyter server``
on the Kubernetes backend is scheduled onto the cluster's real node (Kubernetes' kubelet on
containerd and runc, tests/cluster/real_node.py), runs in a container of the kernel image built
from examples/kubernetes/kernel-image's Dockerfile (tests/cluster/images.py), gets its GPU from
NVIDIA's device plugin over the simulated NVML (tests/cluster/nvidia_device_plugin.py,
tests/support/nvml_sim), and the server reaches it over the pod's address with Curve-encrypted
ZMQ. The pod is the one the backend renders, unmodified (Secret volume mode 0400, ``fsGroup``,
the image's user, ports)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import OWNER_LABEL, pod_name
from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane, KubeCluster
from ..cluster.gpu_node import gpu_node
from ..cluster.images import kernel_image
from ..cluster.nodes import gfd_labels
from ..cluster.nvidia_device_plugin import write_config
from ..cluster.real_node import NODE_IP, RealNode
from ..support.nodes import BIN, Node
from ..support.nvml_sim import SimulatedCard
from ..support.polling import async_wait_until, wait_until
from ..support.servers import PORT_IN_USE, JupyterServer, execute, free_port, start_server
from .conftest import MakeKube
from .kubernetes_server.support import get, listed_by_jupyter_server, running_view
from .kubernetes_server.support import start as start_kernel
from .test_broker_kubernetes import call, hub_and_broker, server_of
from .test_kubernetes import answered_without_curve, manager, nothing_left, secret_files

pytestmark = pytest.mark.integration

CARD = SimulatedCard("GPU-5e0c1a2b-0000-4000-8000-00000000c0de", "NVIDIA A100-SXM4-80GB", 80 * GiB)
REPLICAS = 4  # the device plugin's time-slicing: four kernels may share the card


@pytest.fixture(scope="module")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """The real node as a GPU node (tests/cluster/gpu_node.py): NVIDIA's device plugin
    advertising ``REPLICAS`` shares of the simulated card."""
    workdir = tmp_path_factory.mktemp("real-gpu-node")
    with gpu_node(
        control_plane,
        workdir,
        [CARD],
        write_config(workdir / "device-plugin.yaml", REPLICAS),
        ("nvidia.com/gpu", REPLICAS),
        labels=gfd_labels(memory_mib=CARD.memory_total // 2**20, replicas=REPLICAS),
    ) as gpu:
        yield gpu.node


@pytest.fixture
def kube(make_kube: MakeKube) -> KubeCluster:
    return make_kube([], real_node=True)


@pytest.fixture
def server(node: Node, kube: KubeCluster) -> Iterator[JupyterServer]:
    started = real_node_server(node, kube)
    yield started
    started.stop()


def real_node_server(node: Node, kube: KubeCluster) -> JupyterServer:
    """A jupyter server on the Kubernetes backend (NVIDIA's device plugin preset), listening on
    the node's address, where its kernel pods reach it to report their use."""
    for attempt in range(5):
        # Its own address is in its settings: a port taken meanwhile (CI: "The port … is already
        # in use") is not retried by the server but here, with the settings that name it.
        port = free_port(NODE_IP)
        try:
            return start_server(
                node,
                "real-node",
                {
                    "KUBECONFIG": str(kube.kubeconfig),
                    "JUPYTER_GPUSHARE_BACKEND": "kubernetes",
                    "JUPYTER_GPUSHARE_RESOURCE_PRESET": "nvidia",
                    "JUPYTER_GPUSHARE_KERNEL_IMAGE": kernel_image().reference,
                    "JUPYTER_GPUSHARE_SERVER_URL": f"http://{NODE_IP}:{port}/",
                    "JUPYTER_GPUSHARE_OWNER": "alice",
                    "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
                },
                ip=NODE_IP,
                port=port,
            )
        except RuntimeError as error:
            if PORT_IN_USE not in str(error) or attempt == 4:
                raise
    raise AssertionError("unreachable")


async def test_a_timeslice_kernel_runs_in_a_real_pod_with_the_gpu_the_device_plugin_gave_it(
    server: JupyterServer, kube: KubeCluster, real_node: RealNode
) -> None:
    body = {"name": "python3-gpu-4g", "path": "work/real.ipynb", "gpu_memory": "4G", "gpu_mode": "timeslice"}
    started = await asyncio.to_thread(start_kernel, server, body)
    kernel_id = started["kernel_id"]
    view = await asyncio.to_thread(running_view, server, kernel_id, 300)
    assert view["node"] == real_node.name and view["pod"] == pod_name(kernel_id)
    [pod] = kube.pods()
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["podIP"].startswith("198.18.0.")
    [container] = pod["status"]["containerStatuses"]
    assert container["image"].endswith(kernel_image().reference.rsplit("/", 1)[-1])
    task = container["containerID"].removeprefix("containerd://")
    assert task in real_node.ctr("tasks", "list")
    # Running in its pod; jupyter_server lists it once the kernel answered (as the panel waits).
    await asyncio.to_thread(listed_by_jupyter_server, server, kernel_id)

    # Over the pod's address, Curve-encrypted (the server's ZMQ sockets carry the keys of the
    # connection file the pod's Secret holds): the kernel runs as the image's user, with the
    # card NVIDIA's device plugin allocated, and its %gpu reaches the server.
    code = (
        "import os, json\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
        "'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES')}))\n"
    )
    out, errors = await execute(server, kernel_id, code, timeout=120)
    assert errors == ""
    assert json.loads(out) == {"uid": 1000, "gid": 100, "visible": CARD.uuid}
    # Without the Curve keys of the pod's Secret, its shell socket answers nobody.
    [secret] = kube.secrets()
    connection = json.loads(secret_files(secret)["connection.json"])
    assert connection["curve_publickey"]
    assert not await answered_without_curve(pod["status"]["podIP"], connection["key"])
    out, errors = await execute(server, kernel_id, "%gpu status", timeout=120)
    assert errors == ""
    assert f"GPU slice: 4G (timeslice) in pod {pod_name(kernel_id)}" in out, out

    pool = get(server, "pool")
    [device] = [device for device in pool["devices"] if device["node"] == real_node.name]
    assert device["memory_reserved"] == 4 * GiB

    stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
    assert stopped.status == 204, stopped.body
    await nothing_left(kube)
    freed = get(server, "pool")
    assert [d["memory_reserved"] for d in freed["devices"] if d["node"] == real_node.name] == [0]
    # The kernel's container goes from the node's containerd too, not only the pod from the API
    # (a shutdown deletes the pod at once: the kubelet stops its containers after).
    await asyncio.to_thread(
        wait_until,
        lambda: real_node.ctr("tasks", "list"),
        60,
        0.5,
        "the kernel's container gone from containerd",
        until=lambda tasks: task not in tasks,
    )


async def test_a_kernel_past_its_container_memory_limit_is_oom_killed_by_the_cgroup_and_says_so(
    kube: KubeCluster, real_node: RealNode, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet's words for the end of a kernel whose container outgrew its memory limit
    (the kernel's own cgroup, not a test's kill), as the provisioner reads them from the pod."""
    limit = {"spec": {"containers": [{"name": "kernel", "resources": {"limits": {"memory": "256Mi"}}}]}}
    kernels = manager(
        resource_preset="nvidia",
        kernel_image=kernel_image().reference,
        pod_template=limit,
        launch_timeout=300.0,
    )
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    try:
        km = kernels.get_kernel(kernel_id)
        [pod] = kube.pods()
        assert pod["spec"]["nodeName"] == real_node.name
        [kernel] = [c for c in pod["spec"]["containers"] if c["name"] == "kernel"]
        assert kernel["resources"]["limits"] == {"memory": "256Mi", "nvidia.com/gpu": "1"}
        caplog.set_level(logging.WARNING)
        client = km.client()
        client.start_channels()
        client.execute("hog = bytearray(512 * 2**20)")  # zeroed page by page: past 256Mi
        await async_wait_until(km.is_alive, 120, 0.2, "the kernel's end", until=lambda alive: not alive)
        assert await km.provisioner.poll() == 137
        assert km.provisioner.ended_reason == "OOMKilled (exit code 137)"
        assert "OOMKilled (exit code 137)" in caplog.text
        terminated = kube.pods()[0]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["reason"] == "OOMKilled"  # the kubelet's own status, which the reason quotes
        client.stop_channels()
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)


async def test_a_kernel_the_oom_killer_ended_is_restarted_in_a_new_pod_and_says_why(
    node: Node, kube: KubeCluster, real_node: RealNode
) -> None:
    """Through a real server: the kernel's container outgrows its memory limit, the kubelet
    reports OOMKilled, jupyter_server restarts the kernel into a new pod on the real node, the
    notebook's next cell runs there, and the REST view (the panel's row) says why it restarted,
    in the kubelet's words."""
    node.write_server_config(
        {
            "pod_template": {
                "spec": {"containers": [{"name": "kernel", "resources": {"limits": {"memory": "256Mi"}}}]}
            }
        }
    )
    server = await asyncio.to_thread(real_node_server, node, kube)
    try:
        body = {"name": "python3-gpu-4g", "path": "work/oom.ipynb", "gpu_memory": "4G"}
        kernel_id = (await asyncio.to_thread(start_kernel, server, body))["kernel_id"]
        await asyncio.to_thread(running_view, server, kernel_id, 300)
        [first] = kube.pods()
        assert first["spec"]["nodeName"] == real_node.name
        await asyncio.to_thread(listed_by_jupyter_server, server, kernel_id)
        # Zeroed page by page, past the 256Mi limit: the kernel's own cgroup ends it (no reply
        # comes: the cell is sent, as a notebook sends it, and the kernel's end is waited for).
        await submit(server, kernel_id, "hog = bytearray(512 * 2**20)")

        def restarted() -> dict[str, object]:
            view = server.request("GET", f"/api/gpushare/kernels/{kernel_id}").body
            pods = kube.pods()
            return {"view": view, "pods": pods}

        seen = await asyncio.to_thread(
            wait_until,
            restarted,
            300,
            0.5,
            "the kernel running again in a new pod",
            until=lambda now: (
                now["view"].get("state") == "running"
                and [p["metadata"]["uid"] for p in now["pods"]] not in ([], [first["metadata"]["uid"]])
            ),
        )
        view = seen["view"]
        assert any("OOMKilled (exit code 137)" in warning for warning in view["warnings"]), view
        [second] = seen["pods"]
        assert second["spec"]["nodeName"] == real_node.name
        assert "OOMKilled (exit code 137)" in server.log()
        out, errors = await execute(server, kernel_id, "print(6 * 7)", timeout=120)
        assert (out.strip(), errors) == ("42", "")
        stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        assert stopped.status == 204, stopped.body
        await nothing_left(kube)
    finally:
        await asyncio.to_thread(server.stop)


def test_a_users_kernel_started_through_the_broker_runs_on_the_real_node(
    kube: KubeCluster, real_node: RealNode, tmp_path: Path
) -> None:
    """The hub's user asks their server, which asks the broker (the only holder of the cluster's
    credentials): the pod runs on the real node with the card NVIDIA's device plugin gave it,
    the user's server reaches it over the pod's address, and the slice is free once it ends."""
    kernelspecs = {"gpu-4g": {"gpu_memory": "4G", "gpu_mode": "timeslice"}}
    with hub_and_broker(
        tmp_path, kube, kernelspecs, "nvidia", {}, kernel_image=kernel_image().reference, server_ip=NODE_IP
    ) as setup:
        started = call(setup, "alice", "POST", "kernels", {"name": "gpu-4g", "path": "real.ipynb"})
        assert started[0] in (201, 202), (started, setup.log()[-3000:])
        kernel_id = started[1]["kernel_id"]
        view = wait_until(
            lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}"),
            300,
            0.5,
            f"alice's kernel {kernel_id} running",
            until=lambda answer: answer[0] == 200 and answer[1]["state"] == "running",
        )[1]
        assert view["node"] == real_node.name, view
        [pod] = kube.pods()
        assert pod["spec"]["nodeName"] == real_node.name
        assert pod["metadata"]["labels"][OWNER_LABEL] == "alice"
        alice = server_of(setup, "alice")
        wait_until(
            lambda: setup.hub.call("GET", f"/user/alice/api/kernels/{kernel_id}", token=alice.token)[0],
            120,
            0.2,
            f"alice's server listing kernel {kernel_id}",
            until=lambda status: status == 200,
        )
        code = "import os\nprint(os.environ.get('NVIDIA_VISIBLE_DEVICES'))\n%gpu status"
        out, errors = asyncio.run(execute(alice, kernel_id, code, timeout=120))
        assert errors == "", errors
        assert out.splitlines()[0] == CARD.uuid, out
        assert f"GPU slice: 4G (timeslice) in pod {pod_name(kernel_id)}" in out, out

        ended = setup.hub.call("DELETE", f"/user/alice/api/kernels/{kernel_id}", token=alice.token)
        assert ended[0] == 204, ended
        asyncio.run(nothing_left(kube))
        pool = wait_until(
            lambda: call(setup, "alice", "GET", "pool")[1],
            60,
            0.5,
            "the slice free in alice's pool",
            until=lambda pool: (
                [d["memory_reserved"] for d in pool["devices"] if d["node"] == real_node.name] == [0]
            ),
        )
        assert pool


async def submit(server: JupyterServer, kernel_id: str, code: str) -> None:
    """Send one cell to the server's kernel over its websocket, waiting for no reply."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"{server.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels"
    connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"}))
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "test"}
    header |= {"session": uuid.uuid4().hex, "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    await connection.write_message(json.dumps(message))
    connection.close()


def test_the_doctors_test_kernel_is_green_on_the_real_node(node: Node, kube: KubeCluster) -> None:
    """``jupyter gpushare doctor`` as an administrator runs it against the cluster: its test
    kernel is a pod on the real node and sees the card the device plugin allocated."""
    env = dict(
        node.env,
        KUBECONFIG=str(kube.kubeconfig),
        JUPYTER_GPUSHARE_BACKEND="kubernetes",
        JUPYTER_GPUSHARE_NAMESPACE=kube.namespace,
        JUPYTER_GPUSHARE_RESOURCE_PRESET="nvidia",
        JUPYTER_GPUSHARE_KERNEL_IMAGE=kernel_image().reference,
        JUPYTER_GPUSHARE_LAUNCH_TIMEOUT="300",
    )
    ran = subprocess.run(
        [str(BIN / "jupyter"), "gpushare", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    checks = {check["name"]: check for check in json.loads(ran.stdout)["checks"]}
    kernel = checks["test kernel"]
    assert kernel["status"] == "OK", (kernel, ran.stderr[-2000:])
    assert kernel["detail"].startswith(f"NVIDIA_VISIBLE_DEVICES={CARD.uuid}, slice 512 MiB"), kernel
    assert kube.pods() == []  # the test kernel's pod went with it
