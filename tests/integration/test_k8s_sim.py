"""The node simulator itself (tests/integration/k8s_sim/), driven through the official client.

The Kubernetes backend's tests trust the simulated cluster to behave as a cluster does; these
tests hold it to that: a real ``SimulatedCluster`` on loopback, its kubeconfig loaded by the
``kubernetes`` package, pods created, read, listed, watched and deleted over HTTP, and their
processes checked on this machine. The selectors are tested on their own in
tests/unit/test_k8s_sim_selectors.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from ..polling import wait_until
from .k8s_sim import SimulatedCluster, hami_nodes
from .kernels import has_ended

pytestmark = pytest.mark.integration

NAMESPACE = "sim"
BROKEN_IMAGE = "registry.example.com/no-such-image:1"
# Two nodes with 10 GiB of vGPU memory each: two 8 GiB pods need both.
GPUMEM_MIB = 10240


@pytest.fixture(autouse=True)
def close_kernel_manager_contexts() -> Iterator[None]:
    """These tests start no kernel manager: nothing for the conftest's fixture of this name to
    close, and its scan of every live object costs a few tenths of a second a test."""
    yield


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatedCluster]:
    nodes = hami_nodes(2, gpumem_mib=GPUMEM_MIB)
    with SimulatedCluster(tmp_path, NAMESPACE, nodes=nodes, broken_images=[BROKEN_IMAGE]) as cluster:
        yield cluster


@pytest.fixture
def core(sim: SimulatedCluster) -> Iterator[k8s_client.CoreV1Api]:
    """The official client, configured from the kubeconfig the cluster wrote."""
    api_client = k8s_config.new_client_from_config(config_file=str(sim.kubeconfig))
    yield k8s_client.CoreV1Api(api_client)
    api_client.close()


def python_pod(
    name: str,
    code: str,
    *,
    gpumem_mib: int | None = None,
    image: str = "python:3.11",
    labels: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod running ``python -c code`` (the simulator runs this machine's Python)."""
    container: dict[str, Any] = {"name": "main", "image": image, "command": ["python", "-c", code]}
    if gpumem_mib is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(gpumem_mib)}}
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


# Prints its pid (the test finds the process by it), then waits to be stopped.
SERVE = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"


def read(core: k8s_client.CoreV1Api, name: str) -> k8s_client.V1Pod:
    return core.read_namespaced_pod(name, NAMESPACE)


def phase(core: k8s_client.CoreV1Api, name: str, wanted: str, timeout: float = 15) -> k8s_client.V1Pod:
    return wait_until(
        lambda: read(core, name),
        timeout,
        message=f"pod {name} {wanted}",
        until=lambda pod: pod.status.phase == wanted,
    )


def events(core: k8s_client.CoreV1Api, name: str) -> list[k8s_client.CoreV1Event]:
    return list(core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items)


def gone(core: k8s_client.CoreV1Api, name: str) -> bool:
    try:
        read(core, name)
    except ApiException as error:
        assert error.status == 404, error
        return True
    return False


def pid_of(core: k8s_client.CoreV1Api, name: str) -> int:
    """The pid a running SERVE pod printed, read through the API's log subresource."""
    phase(core, name, "Running")
    log = wait_until(lambda: core.read_namespaced_pod_log(name, NAMESPACE), 15, message=f"{name}'s output")
    return int(log.split()[0])


# ---- the scheduler ---------------------------------------------------------------------------


def test_a_pod_that_fits_is_bound_to_a_node_with_room_and_runs(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NAMESPACE, python_pod("first", SERVE, gpumem_mib=8192))
    first = phase(core, "first", "Running")
    core.create_namespaced_pod(NAMESPACE, python_pod("second", SERVE, gpumem_mib=8192))
    second = phase(core, "second", "Running")

    # The first node has 2 GiB left after the first pod: the second goes to the other node.
    assert (first.spec.node_name, second.spec.node_name) == ("gpu-node-1", "gpu-node-2")
    assert second.spec.scheduler_name == "default-scheduler"
    assert second.status.pod_ip.startswith("127.") and second.status.pod_ip != first.status.pod_ip
    assert [ip.ip for ip in second.status.pod_ips] == [second.status.pod_ip]
    assert second.status.host_ip == "127.0.0.1" and second.status.start_time is not None
    [container] = second.status.container_statuses
    assert (container.name, container.image, container.ready, container.restart_count) == (
        "main",
        "python:3.11",
        True,
        0,
    )
    assert container.state.running.started_at is not None
    assert container.state.waiting is None and container.state.terminated is None
    assert {(c.type, c.status) for c in second.status.conditions} == {
        ("PodScheduled", "True"),
        ("Initialized", "True"),
        ("ContainersReady", "True"),
        ("Ready", "True"),
    }
    reasons = [(event.reason, event.source.component) for event in events(core, "second")]
    assert reasons == [
        ("Scheduled", "default-scheduler"),
        ("Pulled", "kubelet"),
        ("Created", "kubelet"),
        ("Started", "kubelet"),
    ]
    assert events(core, "second")[0].message == f"Successfully assigned {NAMESPACE}/second to gpu-node-2"

    # Its command runs here, as a process of its own.
    assert psutil.Process(pid_of(core, "second")).is_running()
    assert sim.violations == []


def test_a_pod_that_fits_nowhere_stays_pending_with_the_schedulers_reason_until_room_is_freed(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    for name in ("busy-1", "busy-2"):
        core.create_namespaced_pod(NAMESPACE, python_pod(name, SERVE, gpumem_mib=8192))
        phase(core, name, "Running")
    core.create_namespaced_pod(NAMESPACE, python_pod("waiting", SERVE, gpumem_mib=4096))

    [failed] = wait_until(
        lambda: [event for event in events(core, "waiting") if event.reason == "FailedScheduling"],
        15,
        message="the FailedScheduling event",
    )
    reason = "0/2 nodes are available: 2 Insufficient nvidia.com/gpumem."
    assert (failed.type, failed.source.component, failed.message) == ("Warning", "default-scheduler", reason)
    pending = read(core, "waiting")
    assert pending.status.phase == "Pending" and pending.spec.node_name is None
    [condition] = pending.status.conditions
    assert (condition.type, condition.status, condition.reason, condition.message) == (
        "PodScheduled",
        "False",
        "Unschedulable",
        reason,
    )

    # The scheduler keeps trying: once a pod is deleted, its room goes to the waiting pod.
    core.delete_namespaced_pod("busy-2", NAMESPACE, grace_period_seconds=0)
    placed = phase(core, "waiting", "Running")
    assert placed.spec.node_name == "gpu-node-2"
    assert [event.reason for event in events(core, "waiting")].count("FailedScheduling") == 1
    assert sim.violations == []


# ---- the kubelet -----------------------------------------------------------------------------


def test_an_unknown_image_fails_to_pull_and_nothing_runs(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NAMESPACE, python_pod("broken", SERVE, image=BROKEN_IMAGE))
    pod = wait_until(
        lambda: read(core, "broken"),
        15,
        message="a waiting container",
        until=lambda pod: pod.status.container_statuses,
    )
    not_found = (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{BROKEN_IMAGE}": not found'
    )
    [container] = pod.status.container_statuses
    assert (container.state.waiting.reason, container.state.waiting.message) == ("ErrImagePull", not_found)
    assert container.ready is False and pod.status.phase == "Pending"
    assert pod.spec.node_name == "gpu-node-1"  # scheduled; the kubelet cannot start it
    pulled = [(event.reason, event.type, event.message) for event in events(core, "broken")]
    # After Scheduled; a second Failed (ImagePullBackOff) follows a second later.
    assert pulled[1:3] == [
        ("Pulling", "Normal", f'Pulling image "{BROKEN_IMAGE}"'),
        ("Failed", "Warning", f'Failed to pull image "{BROKEN_IMAGE}": {not_found}'),
    ]
    assert sim.node.running == {}
    with pytest.raises(ApiException) as no_output:
        core.read_namespaced_pod_log("broken", NAMESPACE)
    assert no_output.value.status == 400


READ_THE_SECRET = """
import json, os, stat
mount = "/etc/kernel"
print(json.dumps({
    "entries": sorted(os.listdir(mount)),
    "links": {name: os.readlink(os.path.join(mount, name))
              for name in os.listdir(mount) if os.path.islink(os.path.join(mount, name))},
    "token": open(os.path.join(mount, "token")).read(),
    "ip": json.load(open(os.path.join(mount, "connection.json")))["ip"],
    "mode": stat.S_IMODE(os.stat(os.path.join(mount, "token")).st_mode),
}))
"""


def secret_pod(name: str, code: str, mode: int) -> dict[str, Any]:
    return python_pod(
        name,
        code,
        volumes=[{"name": "connection", "secret": {"secretName": "kernel-conn", "defaultMode": mode}}],
        mounts=[{"name": "connection", "mountPath": "/etc/kernel", "readOnly": True}],
    )


def test_a_secret_volume_is_laid_out_as_kubelet_does_once_the_secret_exists(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NAMESPACE, secret_pod("reader", READ_THE_SECRET, 0o400))
    # Before the Secret exists, kubelet cannot mount it: the pod waits.
    [failed_mount] = wait_until(
        lambda: [event for event in events(core, "reader") if event.reason == "FailedMount"],
        15,
        message="the FailedMount event",
    )
    assert 'secret "kernel-conn" not found' in failed_mount.message
    assert read(core, "reader").status.phase == "Pending"

    secret = {"ip": "0.0.0.0", "shell_port": 50001}
    core.create_namespaced_secret(
        NAMESPACE,
        {
            "metadata": {"name": "kernel-conn"},
            "stringData": {"connection.json": json.dumps(secret), "token": "s3cret"},
        },
    )
    pod = phase(core, "reader", "Succeeded")
    [container] = pod.status.container_statuses
    assert (container.state.terminated.exit_code, container.state.terminated.reason) == (0, "Completed")

    seen = json.loads(core.read_namespaced_pod_log("reader", NAMESPACE))
    data = "..2025_01_01_00_00_00.000000000"
    assert seen["entries"] == ["..2025_01_01_00_00_00.000000000", "..data", "connection.json", "token"]
    assert seen["links"] == {
        "..data": data,
        "connection.json": "..data/connection.json",
        "token": "..data/token",
    }
    assert seen["token"] == "s3cret" and seen["mode"] == 0o400
    assert seen["ip"] == pod.status.pod_ip  # the pod's own address, in place of 0.0.0.0
    assert sim.violations == []


def test_a_write_into_a_secret_volume_is_a_violation(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "kernel-conn"}, "stringData": {"token": "t"}}
    )
    # Only the token is rewritten; connection.json is not in this Secret.
    core.create_namespaced_pod(
        NAMESPACE, secret_pod("writer", "open('/etc/kernel/token', 'w').write('changed')", 0o644)
    )
    phase(core, "writer", "Succeeded")
    assert sim.violations == ["pod writer wrote into its read-only Secret volume: token"]


def test_deleting_a_pod_stops_its_process(sim: SimulatedCluster, core: k8s_client.CoreV1Api) -> None:
    for name in ("graceful", "at-once"):
        core.create_namespaced_pod(NAMESPACE, python_pod(name, SERVE))
    graceful, at_once = (pid_of(core, name) for name in ("graceful", "at-once"))

    # With a grace period, the pod is marked, its process stopped, then the pod is gone.
    marked = core.delete_namespaced_pod("graceful", NAMESPACE, grace_period_seconds=5)
    assert (
        marked.metadata.deletion_timestamp is not None and marked.metadata.deletion_grace_period_seconds == 5
    )
    wait_until(lambda: gone(core, "graceful"), 15, message="the graceful pod gone")
    assert has_ended(graceful)

    # Grace 0: gone from the API at once; the node kills the process when it notices.
    core.delete_namespaced_pod("at-once", NAMESPACE, grace_period_seconds=0)
    assert gone(core, "at-once")
    wait_until(lambda: has_ended(at_once), 15, message="the process of the deleted pod ended")
    wait_until(lambda: sim.node.running == {}, 15, message="the node forgot its pods")
    assert sim.violations == []


def test_an_oom_kill_ends_the_pod_with_oomkilled(sim: SimulatedCluster, core: k8s_client.CoreV1Api) -> None:
    core.create_namespaced_pod(NAMESPACE, python_pod("hungry", SERVE))
    pid = pid_of(core, "hungry")
    sim.call(lambda: sim.node.oom_kill("hungry"))
    pod = read(core, "hungry")
    assert pod.status.phase == "Failed"
    [container] = pod.status.container_statuses
    assert (container.state.terminated.exit_code, container.state.terminated.reason) == (137, "OOMKilled")
    assert [(c.type, c.status, c.reason) for c in pod.status.conditions] == [
        ("Ready", "False", "PodCompleted")
    ]
    assert has_ended(pid)
    assert sim.violations == []


# ---- list + watch --------------------------------------------------------------------------------


def test_list_and_watch_follow_a_pod_from_creation_to_deletion(
    sim: SimulatedCluster, core: k8s_client.CoreV1Api
) -> None:
    watched = {"app": "watched"}
    # A pod nobody schedules (a scheduler the simulator does not play): it stays as it is.
    marker = python_pod("marker", SERVE, labels=watched)
    marker["spec"]["schedulerName"] = "elsewhere"
    core.create_namespaced_pod(NAMESPACE, marker)

    seen: list[tuple[str, str, str, bool]] = []
    stream = k8s_watch.Watch()

    def follow() -> None:
        for event in stream.stream(
            core.list_namespaced_pod, NAMESPACE, label_selector="app=watched", _request_timeout=60
        ):
            pod = event["object"]
            seen.append((event["type"], pod.metadata.name, pod.status.phase, bool(pod.spec.node_name)))
            if (event["type"], pod.metadata.name) == ("DELETED", "w1"):
                stream.stop()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        # The watch starts with what exists (the marker), then follows the changes.
        wait_until(lambda: seen, 15, message="the watch's first event")
        core.create_namespaced_pod(NAMESPACE, python_pod("unwatched", SERVE))
        core.create_namespaced_pod(NAMESPACE, python_pod("w1", SERVE, labels=watched))
        phase(core, "w1", "Running")

        listed = core.list_namespaced_pod(NAMESPACE, label_selector="app=watched")
        assert sorted(pod.metadata.name for pod in listed.items) == ["marker", "w1"]
        assert listed.metadata.resource_version

        core.delete_namespaced_pod("w1", NAMESPACE, grace_period_seconds=0)
        follower.join(15)
        assert not follower.is_alive(), f"the watch did not see w1 deleted: {seen}"
    finally:
        stream.stop()
    assert seen[0] == ("ADDED", "marker", "Pending", False)
    w1 = [(kind, phase, bound) for kind, name, phase, bound in seen if name == "w1"]
    assert w1[0] == ("ADDED", "Pending", False)
    assert ("MODIFIED", "Pending", True) in w1  # bound to a node
    assert ("MODIFIED", "Running", True) in w1
    assert w1[-1][0] == "DELETED"
    assert {name for _, name, _, _ in seen} == {"marker", "w1"}  # the selector holds on the watch
    assert sim.violations == []
