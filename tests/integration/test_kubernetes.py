"""The Kubernetes backend end to end, on Kubernetes' own control plane (tests/cluster/).

Real kernels start through jupyter_client's AsyncMultiKernelManager with a gpushare kernelspec
and ``backend = "kubernetes"``: the provisioner talks to the real kube-apiserver with the
official client, as the Jupyter server's ServiceAccount under the shipped RBAC
(examples/kubernetes/rbac.yaml); the real kube-scheduler places each pod on one of four
simulated HAMi nodes, whose kubelet runs the pod's command as a local process. Nothing of the
provisioner is mocked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from jupyter_client.session import Session
from traitlets.config import Config

from jupyter_gpushare.backends.kubernetes import kubernetes_backend
from jupyter_gpushare.backends.kubernetes.backend import server_identity
from jupyter_gpushare.backends.kubernetes.cluster.clients import forget_shared_clusters, shared_cluster
from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    HOLDER_ANNOTATION,
    KERNEL_PORTS,
    label_value,
    labels,
    pod_name,
    secret_name,
    selector,
)
from jupyter_gpushare.backends.kubernetes.provisioner import KernelPodError, KubernetesProvisioner
from jupyter_gpushare.backends.processes import current_process, identify
from jupyter_gpushare.backends.protocol import ServerHooks
from jupyter_gpushare.backends.provisioner import SliceProvisioner
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import DoesNotFitError

from ..cluster import EVENTS, NODES, PODS, SECRETS, KubeCluster
from ..support.kernels import kernel_manager, run_cell
from ..support.nodes import BROKEN_IMAGE, IMAGE, Node
from ..support.polling import async_wait_until, wait_until

pytestmark = pytest.mark.integration


def manager(**gpushare: object) -> AsyncMultiKernelManager:
    settings = {
        "backend": "kubernetes",
        "resource_preset": "hami",
        "kernel_image": IMAGE,
        "launch_timeout": 30.0,
        **gpushare,
    }
    config = Config(
        {"GPUShare": settings, "KubernetesProvisioner": {"poll_interval": 0.1, "unschedulable_grace": 0.5}}
    )
    # Connection files in the test's runtime dir, not the working directory.
    return kernel_manager(config)


def ours(kube: KubeCluster) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    gpushare = GPUShare()
    server_id, _ = server_identity(gpushare)
    wanted = dict(pair.split("=") for pair in selector(server_id).split(","))

    def matches(obj: dict[str, Any]) -> bool:
        return all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())

    return [p for p in kube.pods() if matches(p)], [s for s in kube.secrets() if matches(s)]


async def nothing_left(kube: KubeCluster) -> None:
    await async_wait_until(
        lambda: kube.pods() == [] and kube.secrets() == [], 10, message="no pod and no Secret"
    )


def secret_files(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


# ---- one entry point, two backends ----------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "expected"), [("kubernetes", "KubernetesProvisioner"), ("local", "LocalGPUShareProvisioner")]
)
def test_the_gpushare_provisioner_is_the_configured_backends(backend: str, expected: str) -> None:
    """jupyter_client's own provisioner factory loads the entry point and builds the kind's."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.provisioning import KernelProvisionerFactory

    km = AsyncKernelManager(config=Config({"GPUShare": {"backend": backend}}))
    provisioning = {"provisioner_name": "gpushare-provisioner", "config": {"gpu_memory": "4G"}}
    spec = KernelSpec(
        argv=["python"], display_name="x", language="python", metadata={"kernel_provisioner": provisioning}
    )
    provisioner = KernelProvisionerFactory.instance().create_provisioner_instance("k", spec, km)
    assert type(provisioner).__name__ == expected
    assert isinstance(provisioner, SliceProvisioner)
    assert provisioner.gpu_memory == "4G" and provisioner.kernel_id == "k" and provisioner.parent is km


# ---- our client against the real API server ------------------------------------------------------


def test_the_cluster_client_gets_the_api_servers_answers(kube: KubeCluster) -> None:
    """k8s/cluster.py as the Jupyter server's ServiceAccount under the shipped Role: what the real
    API server answers for what is missing, taken, badly asked or not allowed."""
    api = Cluster()  # $KUBECONFIG: the server's identity, the module's namespace as its context's
    namespace = kube.namespace
    try:
        assert api.namespace == namespace
        assert api.read_pod("nope") is None
        assert api.delete_pod("nope") is False
        assert api.delete_secret("nope") is False
        with pytest.raises(ClusterError) as missing:
            api._call("read", lambda: api.core.read_namespaced_pod("nope", namespace, _preload_content=False))
        assert missing.value.api_status == 404 and missing.value.reason == "NotFound"
        assert 'pods "nope" not found' in str(missing.value)
        # The shipped Role lets the server create, list and delete Secrets, never read one by name.
        with pytest.raises(ClusterError) as refused:
            api._call(
                "read", lambda: api.core.read_namespaced_secret("nope", namespace, _preload_content=False)
            )
        assert refused.value.api_status == 403 and refused.value.reason == "Forbidden"
        assert 'User "system:serviceaccount:jupyter:jupyter-gpushare" cannot get resource "secrets"' in str(
            refused.value
        )

        for name, team in (("a", "ml"), ("b", "web"), ("c", "ml")):
            api.create_secret(
                {
                    "metadata": {
                        "name": name,
                        "labels": {"team": team, **({"x": "1"} if name == "c" else {})},
                    },
                    "stringData": {"k": name},
                }
            )
        with pytest.raises(ClusterError) as conflict:
            api.create_secret({"metadata": {"name": "a"}, "stringData": {}})
        assert conflict.value.api_status == 409 and conflict.value.reason == "AlreadyExists"

        def names(label_selector: str) -> list[str]:
            return sorted(s["metadata"]["name"] for s in api.list_secrets(label_selector))

        assert names("team=ml") == ["a", "c"]
        assert names("team==ml,x") == ["c"]
        assert names("team!=ml") == ["b"]
        assert names("team in (web,ops)") == ["b"]
        assert names("team notin (web),!x") == ["a"]
        assert names("") == ["a", "b", "c"]
        with pytest.raises(ClusterError) as bad:
            api.list_secrets("team=(")
        assert bad.value.api_status == 400
        stored = next(s for s in api.list_secrets("team=web"))
        assert "stringData" not in stored and base64.b64decode(stored["data"]["k"]) == b"b"
        assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]

        # Events by field selector, oldest first, as kubectl describe reads them.
        for second, (pod, reason) in enumerate(
            (("p1", "Scheduled"), ("p2", "FailedScheduling"), ("p1", "Started"))
        ):
            stamp = f"2026-01-01T00:00:0{second}Z"
            kube.add(
                EVENTS,
                {
                    "metadata": {"generateName": f"{pod}."},
                    "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                    "reason": reason,
                    "message": reason,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                },
            )
        assert [event["reason"] for event in api.pod_events("p1")] == ["Scheduled", "Started"]
        with pytest.raises(ClusterError, match=r"field label not supported: spec\.nonsense"):
            api._call(
                "list",
                lambda: api.core.list_namespaced_event(
                    namespace, field_selector="spec.nonsense=1", _preload_content=False
                ),
            )
        assert {node["metadata"]["name"] for node in api.list_nodes()} == {
            f"gpu-node-{i}" for i in range(1, 5)
        }
    finally:
        api.close()


def test_the_marker_told_at_once_agrees_with_the_waiting_one_and_moves_with_the_watch(
    kube: KubeCluster,
) -> None:
    """The pool's change marker from the watch's memory (a server's event loop asks it): the
    same as ``change_marker`` before any watch and once the watch listed, moving with a change
    the watch sees (a node labelled). Asking it never starts a watch."""
    forget_shared_clusters()  # this test's own client and watch, not an earlier test's
    backend = kubernetes_backend(GPUShare(backend="kubernetes", resource_preset="hami"))

    def both_agreeing(beyond: object) -> Any:
        """Both markers read back to back, once they agree and differ from ``beyond`` (the
        cluster may change between two reads: a Node's status, a Lease-driven taint)."""
        return wait_until(
            lambda: (backend.change_marker_at_once(), backend.change_marker()),
            90,  # a first listing on a busy machine
            message=f"both markers agreeing, past {beyond}",
            until=lambda pair: pair[0] == pair[1] and pair[0] != beyond,
        )[0]

    try:
        unwatched = both_agreeing(beyond=None)
        assert not shared_cluster().watching  # the process's one client, as the backend's
        backend.attach_server(ServerHooks())  # a server shows the pool: the watch starts
        listed = both_agreeing(beyond=unwatched)
        kube.patch(NODES, "gpu-node-1", {"metadata": {"labels": {"gpushare-test": "marker"}}})
        both_agreeing(beyond=listed)
    finally:
        backend.stop()
        forget_shared_clusters()


# ---- a kernel in a pod ---------------------------------------------------------------------------


async def test_a_kernel_runs_in_its_pod_encrypted_and_leaves_nothing_behind(
    kube: KubeCluster,
) -> None:
    kernels = manager()
    states: list[str] = []
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-vgpu", gpushare_on_state=states.append)
    try:
        km = kernels.get_kernel(kernel_id)
        provisioner = km.provisioner
        assert isinstance(provisioner, KubernetesProvisioner) and isinstance(provisioner, SliceProvisioner)

        # One pod, asking HAMi for the slice; its Secret holds the connection file and token.
        [pod], [secret] = ours(kube)
        assert pod["metadata"]["name"] == pod_name(kernel_id)
        assert pod["metadata"]["namespace"] == kube.namespace
        assert pod["metadata"]["labels"]["jupyter-gpushare.io/kernel-id"] == label_value(kernel_id)
        assert pod["metadata"]["labels"]["jupyter-gpushare.io/owner"] == "alice"
        kernel = pod["spec"]["containers"][0]
        assert kernel["image"] == IMAGE
        assert kernel["resources"]["limits"] == {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "6144",
            "nvidia.com/gpucores": "30",
        }
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert secret["metadata"]["name"] == secret_name(kernel_id)
        files = secret_files(secret)
        connection = json.loads(files["connection.json"])
        token = files["token"]
        assert connection["key"] not in json.dumps(pod) and token not in json.dumps(pod)
        assert {connection[f"{channel}_port"] for channel in KERNEL_PORTS} == set(KERNEL_PORTS.values())

        # The manager connects to the pod's IP over CurveZMQ with the Secret's keys.
        assert km.ip == pod["status"]["podIP"] and km.ip.startswith("127.")
        assert connection["curve_publickey"] and km.curve_publickey == connection["curve_publickey"].encode()
        assert km.session.key == connection["key"].encode()
        assert states[-1].startswith("running on gpu-node-") and any("pending" in s for s in states)

        cell = await run_cell(
            km,
            "import os\n"
            "from jupyter_gpushare.kernel.pod_handle import read_token_file\n"
            "print(os.environ['JUPYTER_GPUSHARE_MODE'], os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])\n"
            "token_file = os.environ['JUPYTER_GPUSHARE_TOKEN_FILE']\n"
            "print('JUPYTER_GPUSHARE_TOKEN' in os.environ, read_token_file(token_file))\n"
            "print(6 * 7)",
        )
        assert cell.error is None, cell
        assert cell.stdout.split("\n")[:3] == ["vgpu 6442450944", f"False {token}", "42"]

        # Without the Curve keys nobody gets an answer: the channel is encrypted.
        assert not await answered_without_curve(km.ip, connection["key"])

        # An interrupt travels on the control channel (a pod takes no signal).
        assert km.kernel_spec.interrupt_mode == "message"
        marker = kube.root / "sleeping"  # the kernel shares this host's disk in the simulation
        code = f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)"
        interrupted = asyncio.create_task(run_cell(km, code, timeout=30))
        await async_wait_until(marker.exists, 10, message="the cell to start")
        await kernels.interrupt_kernel(kernel_id)
        cell = await asyncio.wait_for(interrupted, 15)
        assert cell.error == "KeyboardInterrupt"
        assert (await run_cell(km, "print('still here')")).stdout == "still here\n"
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)
    await async_wait_until(lambda: kube.node.running == {}, 10, message="the node stopped the kernel")


async def test_without_encryption_a_plain_socket_is_answered(kube: KubeCluster) -> None:
    """The control for the probe above: with ``encrypt = False`` the same plain request is answered."""
    kernels = manager(encrypt=False)
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    try:
        km = kernels.get_kernel(kernel_id)
        _, [secret] = ours(kube)
        connection = json.loads(secret_files(secret)["connection.json"])
        assert "curve_publickey" not in connection and km.curve_publickey is None
        assert (await run_cell(km, "print('plain')")).stdout == "plain\n"
        assert await answered_without_curve(km.ip, connection["key"])
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)


async def answered_without_curve(ip: str, key: str) -> bool:
    """Whether the kernel answers a correctly signed kernel_info_request on a plain socket."""

    def probe() -> bool:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        socket.sndtimeo = 1500  # a refused handshake leaves no peer: a send would block forever
        socket.connect(f"tcp://{ip}:{KERNEL_PORTS['shell']}")
        try:
            Session(key=key.encode()).send(socket, "kernel_info_request", {})
            return bool(socket.poll(1500))
        except zmq.Again:
            return False
        finally:
            socket.close()
            context.term()

    return await asyncio.to_thread(probe)


async def test_a_restart_makes_a_new_pod_and_the_kernel_answers_again(kube: KubeCluster) -> None:
    kernels = manager()
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    try:
        km = kernels.get_kernel(kernel_id)
        [first], _ = ours(kube)
        assert (await run_cell(km, "x = 1\nprint(x)")).stdout == "1\n"
        await kernels.restart_kernel(kernel_id)
        [second], [_] = ours(kube)
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        assert km.ip == second["status"]["podIP"] != first["status"]["podIP"]
        # New ports too: jupyter_server renews a reconnecting browser's channels only then.
        assert km.shell_port == KERNEL_PORTS["shell"] + 10
        assert {port["containerPort"] for port in second["spec"]["containers"][0]["ports"]} == {
            port + 10 for port in KERNEL_PORTS.values()
        }
        cell = await run_cell(km, "print('x' in dir())")
        assert cell.stdout == "False\n"  # a fresh kernel process
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)


# ---- failures: the cluster's reason, and nothing left behind ----------------------------------


async def test_an_unschedulable_kernel_fails_with_the_schedulers_reason(
    kube: KubeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = manager()
    states: list[str] = []
    started = time.monotonic()
    caplog.set_level(logging.INFO)
    with pytest.raises(DoesNotFitError) as refused:
        await kernels.start_kernel(kernel_name="gpu-200g-vgpu", gpushare_on_state=states.append)
    assert time.monotonic() - started < 10
    message = str(refused.value)
    # kube-scheduler's own sentence, as kubectl describe shows it: why no node fits, then why
    # preempting pods would not help (1.34 says "… no new claims to deallocate, preemption: …").
    first = "0/4 nodes are available: 4 Insufficient nvidia.com/gpumem."
    preemption = "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    assert f"(asked for nvidia.com/gpu=1, nvidia.com/gpumem=204800): {first}" in message
    assert message.endswith(preemption)
    pending = [state for state in states if state.startswith(f"pending: {first}")]
    assert pending and all(state.endswith(preemption) for state in pending), states
    assert "FailedScheduling" in caplog.text
    assert kernels.list_kernel_ids() == []
    await nothing_left(kube)


async def test_an_image_that_cannot_be_pulled_fails_the_start_with_the_reason(
    kube: KubeCluster,
) -> None:
    kernels = manager(kernel_image=BROKEN_IMAGE)
    with pytest.raises(KernelPodError) as failed:
        await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    assert f"the kernel image {BROKEN_IMAGE} cannot be pulled: ErrImagePull:" in str(failed.value)
    assert "not found" in str(failed.value)
    await nothing_left(kube)


async def test_a_pod_nobody_schedules_fails_at_the_launch_timeout(kube: KubeCluster) -> None:
    kernels = manager(scheduler_name="no-such-scheduler", launch_timeout=1.5)
    started = time.monotonic()
    with pytest.raises(KernelPodError, match=r"did not start within 1\.5 s \(c\.GPUShare\.launch_timeout\)"):
        await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    assert time.monotonic() - started < 6
    await nothing_left(kube)


async def test_a_pod_killed_mid_session_is_reported_with_its_reason(
    kube: KubeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = manager()
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    try:
        km = kernels.get_kernel(kernel_id)
        assert await km.is_alive()
        caplog.set_level(logging.WARNING)
        await kube.acall(lambda: kube.node.oom_kill(pod_name(kernel_id)))
        await async_wait_until(km.is_alive, 10, 0.1, "the kernel's end", until=lambda alive: not alive)
        provisioner = km.provisioner
        assert await provisioner.poll() == 137
        assert provisioner.ended_reason == "OOMKilled (exit code 137)"
        assert "OOMKilled (exit code 137)" in caplog.text
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)


async def test_a_kernel_that_dies_says_why_with_its_last_output(
    node: Node, kube: KubeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    directory = Path(node.env["JUPYTER_PATH"]) / "kernels" / "crashing"
    directory.mkdir(parents=True)
    crash = (
        "import sys, time; time.sleep(1); "
        "print('kernel crashed: a module is missing', file=sys.stderr); sys.exit(3)"
    )
    spec = {
        "argv": ["python", "-c", crash, "{connection_file}"],
        "display_name": "crashing",
        "language": "python",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": "gpushare-provisioner", "config": {"gpu_memory": "4G"}}
        },
    }
    (directory / "kernel.json").write_text(json.dumps(spec))
    kernels = manager()
    caplog.set_level(logging.WARNING)
    kernel_id = await kernels.start_kernel(kernel_name="crashing")
    try:
        km = kernels.get_kernel(kernel_id)
        # As a server's restarter polls.
        await async_wait_until(km.is_alive, 10, 0.1, "the kernel's end", until=lambda alive: not alive)
        assert km.provisioner.ended_reason == "Error (exit code 3)"
        assert await km.provisioner.poll() == 3
        assert "Error (exit code 3); its last output:\nkernel crashed: a module is missing" in caplog.text
    finally:
        await kernels.shutdown_all()
    await nothing_left(kube)


# ---- orphans -------------------------------------------------------------------------------------


async def test_orphans_of_a_gone_server_process_are_collected_at_first_start(
    kube: KubeCluster,
) -> None:
    server_id, owner = server_identity(GPUShare())
    host = os.uname().nodename
    gone = f"{host}/999999/1.0"  # no such process
    me = current_process()
    pid1 = identify(1)
    alive = f"{host}/{me.pid}/{me.start!r}"
    sibling = f"{host}/{pid1.pid}/{pid1.start!r}" if pid1 else alive
    for name, holder, server in (
        ("orphan", gone, server_id),
        ("sibling", sibling, server_id),
        ("other-server", gone, "bob@elsewhere"),
    ):
        meta = {
            "name": f"gpushare-kernel-{name}",
            "labels": labels(name, server, owner),
            "annotations": {HOLDER_ANNOTATION: holder},
            "namespace": kube.namespace,
        }
        kernel = {"name": "kernel", "image": IMAGE, "command": ["sleep", "600"]}
        kube.add(PODS, {"metadata": meta, "spec": {"containers": [kernel]}})
        kube.add(
            SECRETS, {"metadata": {**meta, "name": f"{meta['name']}-conn"}, "stringData": {"token": "t"}}
        )

    kernels = manager(scheduler_name="no-such-scheduler", launch_timeout=0.5)  # only the first start matters
    with pytest.raises(KernelPodError):
        await kernels.start_kernel(kernel_name="gpu-6g-vgpu")
    names = sorted(p["metadata"]["name"] for p in kube.pods())
    assert names == ["gpushare-kernel-other-server", "gpushare-kernel-sibling"]
    assert sorted(s["metadata"]["name"] for s in kube.secrets()) == [
        "gpushare-kernel-other-server-conn",
        "gpushare-kernel-sibling-conn",
    ]
