"""The test cluster's real node: Kubernetes' own kubelet on containerd and runc, CNI bridge
networking on 198.18.0.0/24 (tests/cluster/real_node.py), with the local busybox image.

Pods run in real containers: to Succeeded, their logs through the API server from the kubelet,
a memory limit enforced by the kernel's cgroup (OOMKilled), deletion, a port reachable from the
host at the pod's address, and nothing sent off the machine. The control plane stops in seconds
with a kubelet attached, and a node's stop leaves the machine as it found it.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ..cluster import NODES, PODS, ControlPlane, KubeCluster, RealNode
from ..cluster.build import REPOSITORY
from ..cluster.host_state import HostState
from ..cluster.real_node import NODE_IP, footprint
from ..support.polling import wait_until
from .conftest import MakeKube

pytestmark = pytest.mark.integration
DEADLINE = 180.0  # seconds: a loaded 2-core machine starts a pod in a few


def wait_for(what: str, read: Callable[[], Any], deadline: float = DEADLINE) -> Any:
    """``read()`` once it is true (tests/support/polling.py), failing with ``what`` after ``deadline``."""
    return wait_until(read, deadline, 0.2, what)


def pod_manifest(node: RealNode, name: str, command: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": node.busybox.ref,
        "imagePullPolicy": "IfNotPresent",  # imported: no registry is asked
        "command": ["sh", "-c", command],
        **spec.pop("container", {}),
    }
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def phase(kube: KubeCluster, name: str) -> str:
    pod = kube.get(PODS, name)
    return "" if pod is None else str(pod.get("status", {}).get("phase", ""))


def terminated(kube: KubeCluster, name: str) -> dict[str, Any] | None:
    pod = kube.get(PODS, name) or {}
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if "terminated" in status.get("state", {}):
            found: dict[str, Any] = status["state"]["terminated"]
            return found
    return None


@pytest.fixture
def kube(make_kube: MakeKube) -> KubeCluster:
    """The real node alone (no simulated nodes)."""
    return make_kube([], real_node=True)


@pytest.fixture
def host_server() -> Iterator[tuple[str, int]]:
    """An HTTP server of the host's on the node's address (198.18.255.1): a pod's call-back."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"the host answers\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((NODE_IP, 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield NODE_IP, server.server_address[1]
    server.shutdown()
    server.server_close()


# These three start nodes of their own: they run before the module's shared node exists (one per
# machine).


def test_the_control_plane_stops_in_seconds_with_a_kubelet_attached(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "plane").start()
    try:
        node = RealNode(plane, tmp_path / "node").start()
    except BaseException:
        plane.stop()
        raise
    try:
        process = plane.process
        assert process is not None
        started = time.monotonic()
        plane.stop(timeout=120)
        took = time.monotonic() - started
        log = (tmp_path / "plane" / "controlplane.log").read_text(errors="replace")
        assert "panic" not in log, log[-3000:]
        assert process.returncode == 0
        assert took < 20, f"the control plane took {took:.0f} s to stop"
    finally:
        node.stop()  # without an API server: the restore alone stops the pods' remains
    assert node.leftovers == []


def test_a_stopped_node_leaves_the_machine_as_it_found_it(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    workdir = tmp_path / "node"
    before = HostState.now(footprint(workdir))
    node = RealNode(control_plane, workdir).start()
    try:
        admin = control_plane.admin
        manifest = pod_manifest(node, "sleeper", "sleep 3600")
        manifest["metadata"]["namespace"] = "default"
        admin.create(PODS, manifest)
        wait_for(
            "the pod runs",
            lambda: (admin.get(PODS, "sleeper", "default") or {}).get("status", {}).get("phase") == "Running",
        )
        # While it runs, the machine has changed where the snapshot looks: the check can fail.
        during = before.differences(HostState.now(footprint(workdir)))
        assert any("network interface jgs-cni0" in line for line in during), during
        assert any("kubepods" in line for line in during), during
        assert any("is mounted" in line for line in during), during
        assert any("iptables" in line for line in during), during
    finally:
        node.stop()
    assert node.leftovers == []
    assert before.differences(HostState.now(footprint(workdir))) == []
    assert control_plane.admin.get(NODES, node.name) is None


KILLED_RUN = """
import os, signal, sys, time
from pathlib import Path
from tests.cluster import PODS, ControlPlane
from tests.cluster.real_node import RealNode
plane = ControlPlane(Path(sys.argv[1]), Path(sys.argv[2]))
plane.server = sys.argv[3]
node = RealNode(plane, Path(sys.argv[4])).start()
pod = {"metadata": {"name": "orphan", "namespace": "default"}, "spec": {
    "nodeSelector": {"kubernetes.io/hostname": node.name},
    "containers": [{"name": "main", "image": node.busybox.ref, "command": ["sleep", "3600"]}]}}
plane.admin.create(PODS, pod)
while (plane.admin.get(PODS, "orphan", "default") or {}).get("status", {}).get("phase") != "Running":
    time.sleep(0.2)
print("running", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_node_undoes_a_node_whose_run_was_killed(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    killed, workdir = tmp_path / "killed", tmp_path / "next"
    before = HostState.now(footprint(killed))
    command = [sys.executable, "-c", KILLED_RUN, str(control_plane.directory), str(control_plane.binary)]
    command += [control_plane.server, str(killed)]
    run = subprocess.run(
        command, cwd=REPOSITORY, capture_output=True, text=True, timeout=DEADLINE, check=False
    )
    assert run.returncode == -signal.SIGKILL and "running" in run.stdout, run.stdout + run.stderr
    # Its kubelet and containerd went with it (SIGTERM when their parent died); its pod did not.
    wait_for(
        "the killed run's kubelet and containerd are gone",
        lambda: (
            not [
                process
                for process in psutil.process_iter(["cmdline"])
                if str(killed) in " ".join(process.info["cmdline"] or [])
            ]
        ),
        60,
    )
    assert before.differences(HostState.now(footprint(killed)))  # what the next node must undo

    node = RealNode(control_plane, workdir).start()
    node.stop()
    assert node.leftovers == []
    assert before.differences(HostState.now(footprint(killed))) == []
    assert control_plane.admin.get(PODS, "orphan", "default") is None


# The module's real node from here on.


def test_a_pod_runs_to_succeeded_and_its_log_comes_from_the_kubelet(
    kube: KubeCluster, control_plane: ControlPlane
) -> None:
    node = kube.real_node
    assert node is not None
    registered = kube.get(NODES, node.name)
    assert registered is not None
    info = registered["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    assert info["kubeletVersion"] == control_plane.version
    assert {"type": "InternalIP", "address": NODE_IP} in registered["status"]["addresses"]

    kube.add(PODS, pod_manifest(node, "hello", "echo hello from $(hostname); cat /proc/1/cgroup | head -1"))
    wait_for("the pod Succeeded", lambda: phase(kube, "hello") == "Succeeded")
    log = kube.pod_log("hello")
    assert log.startswith("hello from hello\n"), log
    assert "kubepods" in log  # its processes are in the kubelet's cgroups
    state = terminated(kube, "hello")
    assert state is not None and state["exitCode"] == 0 and state["reason"] == "Completed"


def test_a_container_past_its_memory_limit_is_oom_killed(kube: KubeCluster) -> None:
    node = kube.real_node
    assert node is not None
    limits = {"resources": {"limits": {"memory": "24Mi"}, "requests": {"memory": "24Mi"}}}
    # dd's 64 MiB buffer is touched as it reads into it: past the limit, the cgroup's OOM killer.
    kube.add(PODS, pod_manifest(node, "hog", "dd if=/dev/zero of=/dev/null bs=64M count=4", container=limits))
    state = wait_for("the container terminated", lambda: terminated(kube, "hog"))
    assert state["reason"] == "OOMKilled", state
    assert state["exitCode"] == 137
    wait_for("the pod Failed", lambda: phase(kube, "hog") == "Failed")


def test_a_deleted_pod_s_container_is_gone(kube: KubeCluster) -> None:
    node = kube.real_node
    assert node is not None
    kube.add(PODS, pod_manifest(node, "doomed", "sleep 3600"))
    wait_for("the pod runs", lambda: phase(kube, "doomed") == "Running")
    pod = kube.get(PODS, "doomed")
    assert pod is not None
    container = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    tasks = node.ctr("tasks", "list")
    pid = next(int(line.split()[1]) for line in tasks.splitlines() if line.startswith(container))
    assert os.path.exists(f"/proc/{pid}")

    kube.remove(PODS, kube.namespace, "doomed")
    wait_for("the kubelet has removed the pod", lambda: kube.get(PODS, "doomed") is None)
    assert container not in node.ctr("tasks", "list")
    wait_for("the container's process is gone", lambda: not os.path.exists(f"/proc/{pid}"), 30)


def test_a_pod_s_port_answers_the_host_at_the_pod_s_address(kube: KubeCluster) -> None:
    node = kube.real_node
    assert node is not None
    serve = (
        "mkdir -p /tmp/www && echo served by $(hostname) > /tmp/www/index.html"
        " && exec httpd -f -p 8080 -h /tmp/www"
    )
    probe = {"readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1}}
    kube.add(PODS, pod_manifest(node, "web", serve, container={"ports": [{"containerPort": 8080}], **probe}))
    pod = wait_for(
        "the pod is Ready (the kubelet's probe reached it)",
        lambda: next(
            (
                found
                for found in [kube.get(PODS, "web")]
                if found
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in found.get("status", {}).get("conditions", [])
                )
            ),
            None,
        ),
    )
    address = pod["status"]["podIP"]
    assert address.startswith("198.18.0.")
    answer = httpx.get(f"http://{address}:8080/index.html", timeout=30)
    assert answer.text == "served by web\n"


def test_a_pod_reaches_the_host_and_nothing_off_the_machine(
    kube: KubeCluster, host_server: tuple[str, int]
) -> None:
    node = kube.real_node
    assert node is not None
    host, port = host_server
    refused_before = node.refused()
    # 10.96.0.1 is the kubernetes Service: with no kube-proxy, it would be routed off the machine.
    # (No -T: Debian's static busybox 1.35 wget crashes with a timeout set.) Everything on stdout:
    # the runtime logs stdout and stderr apart, and their lines may interleave out of order.
    command = (
        f"wget -q -O- http://{host}:{port}/ 2>&1; echo host: $?; "
        "wget -q -O- http://10.96.0.1:443/ 2>&1; echo service: $?"
    )
    kube.add(PODS, pod_manifest(node, "caller", command))
    wait_for("the pod finished", lambda: phase(kube, "caller") in ("Succeeded", "Failed"))
    log = kube.pod_log("caller")
    assert "the host answers\nhost: 0\n" in log, log
    assert "Connection refused" in log and "service: 1" in log, log
    # Refused at the node's chain (a reset there, not an answer from elsewhere or a timeout).
    assert node.refused() > refused_before
