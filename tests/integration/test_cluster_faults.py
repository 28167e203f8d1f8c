"""Watch and API faults on Kubernetes' own control plane: kube-apiserver restarted mid-watch, a
watch answered ``410 Gone`` after etcd compacted its version away, and the API server unreachable
for 20 s.

This module runs its own control plane (:mod:`.faults`, shared with test_broker_faults.py), so
it can take it down and bring it back without disturbing other modules. A Jupyter server on the
Kubernetes backend holds kernel pods through each fault: it must relist and go on, count nothing
twice, lose no kernel, and while the API is gone refuse a start with one sentence and say in its
pool why the view may be stale.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from jupyter_gpushare.backends.kubernetes.cluster import cluster as cluster_module
from jupyter_gpushare.backends.kubernetes.cluster import watch as watch_module
from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError, load_configuration
from jupyter_gpushare.backends.kubernetes.cluster.watch import Watched
from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane, KubeCluster
from ..cluster.rest import NAMESPACES
from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute
from .faults import api_server_down, own_control_plane, runs_code_throughout
from .kubernetes_server.support import POLL, get, running_view, server_for, start
from .test_kubernetes import nothing_left

pytestmark = pytest.mark.integration

SLICE = 6 * GiB  # what kernelspec gpu-6g-vgpu reserves


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (the tests stop and restart it)."""
    with own_control_plane(tmp_path_factory.mktemp("faulty-plane")) as plane:
        yield plane


@pytest.fixture
def server(node: Node, kube: KubeCluster) -> Iterator[JupyterServer]:
    started = server_for(node, kube, name="faults")
    yield started
    started.stop()


def start_kernel(server: JupyterServer) -> str:
    kernel_id = str(start(server, {"name": "gpu-6g-vgpu"})["kernel_id"])
    running_view(server, kernel_id, timeout=90)
    return kernel_id


def kernel_ids(server: JupyterServer) -> list[str]:
    """The server's kernels as ``GET kernels`` lists them; ``GET pool`` must count what they
    reserve once (each a 6G slice)."""
    listed = sorted(kernel["kernel_id"] for kernel in get(server, "kernels"))
    reserved = sum(device["memory_reserved"] for device in get(server, "pool")["devices"])
    assert reserved == len(listed) * SLICE, (listed, reserved)
    return listed


def pool_problem(server: JupyterServer, until: Callable[[str | None], bool]) -> str | None:
    """The pool's ``problem`` once ``until`` holds for it (None: the pool is current)."""
    return wait_until(lambda: get(server, "pool").get("problem"), 60, POLL, "the pool's problem", until=until)


async def stop_kernels(server: JupyterServer, kube: KubeCluster, kernel_ids: list[str]) -> None:
    for kernel_id in kernel_ids:
        stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
        assert stopped.status == 204, stopped.body
    await nothing_left(kube)


async def test_a_restarted_api_server_is_relisted_and_nothing_is_counted_twice_or_lost(
    control_plane: ControlPlane, kube: KubeCluster, server: JupyterServer
) -> None:
    first = await asyncio.to_thread(start_kernel, server)
    assert kernel_ids(server) == [first]
    control_plane.down()
    await asyncio.to_thread(control_plane.start)
    # A start after the restart is seen running only through the relisted, re-watched pods.
    second = await asyncio.to_thread(start_kernel, server)
    assert kernel_ids(server) == sorted([first, second])  # each once
    assert await execute(server, first, "print(6 * 7)") == ("42\n", "")
    await stop_kernels(server, kube, [first, second])


async def test_while_the_api_server_is_gone_starts_fail_with_one_sentence_and_kernels_run_on(
    control_plane: ControlPlane, kube: KubeCluster, server: JupyterServer
) -> None:
    running = await asyncio.to_thread(start_kernel, server)
    host = kube.url
    with api_server_down(control_plane) as gone:
        refused = await asyncio.to_thread(
            server.request, "POST", "/api/gpushare/kernels", {"name": "gpu-6g-vgpu"}
        )
        assert refused.status == 503, refused.body
        message = refused.body["message"]
        assert re.fullmatch(
            rf"cannot reach the Kubernetes API at {host} to create Secret gpushare-kernel-[0-9a-f-]+-conn:"
            r" connection refused\.",
            message,
        ), message
        # The kernel runs on: its pod's process and its sockets need no API server.
        await runs_code_throughout(lambda: execute(server, running, "print(6 * 7)"), gone)
        assert kernel_ids(server) == [running]  # the last view stays: nothing dropped or doubled
    after = await asyncio.to_thread(start_kernel, server)
    assert kernel_ids(server) == sorted([running, after])
    await stop_kernels(server, kube, [running, after])


async def test_while_the_api_server_is_gone_the_pool_says_why_though_nothing_in_it_changed(
    control_plane: ControlPlane, server: JupyterServer
) -> None:
    """No kernel runs, so no usage report moves the pool's change marker: only the watch's
    own problem can tell the server's cached pool that it is stale (the panel's banner)."""
    await asyncio.to_thread(pool_problem, server, lambda problem: problem is None)  # current before the fault
    with api_server_down(control_plane):
        problem = await asyncio.to_thread(pool_problem, server, lambda problem: problem is not None)
        assert str(problem).startswith("cannot reach the Kubernetes API to watch "), problem
    await asyncio.to_thread(pool_problem, server, lambda problem: problem is None)


def test_a_watch_answered_410_gone_relists_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's watch thread (:class:`Watched`) on a control plane without the API server's
    watch cache, so that a watch reads etcd, which compacts old revisions away every second: a
    watch resumed from such a version is answered 410 Gone, and the thread lists again."""
    monkeypatch.setattr(watch_module, "WATCH_SECONDS", 2)  # end watches often, resume from old versions
    with own_control_plane(tmp_path / "plane", compacting=True) as plane:
        monkeypatch.setenv("KUBECONFIG", str(plane.admin_kubeconfig))
        api = Cluster("default", configuration=load_configuration().configuration)
        calls: list[tuple[bool, str]] = []  # (a watch?, the resourceVersion it asked from)

        def list_namespaces(**options: Any) -> Any:
            calls.append((bool(options.get("watch")), str(options.get("resource_version") or "")))
            return api.core.list_namespace(**options)

        namespaces = Watched("namespaces", list_namespaces, lambda: None)
        namespaces.start()
        try:
            assert namespaces.synced.wait(30)

            def relisted_after_a_resumed_watch() -> str | None:
                for (was_watch, version), (is_watch, _) in itertools.pairwise(list(calls)):
                    if was_watch and not is_watch and version:
                        return version
                return None

            gone = wait_until(relisted_after_a_resumed_watch, 60, POLL, "a watch resumed, then a list")
            # The API server's own answer to that version: 410 Gone (etcd compacted it away).
            answer = plane.admin.text(
                "/api/v1/namespaces", watch="true", resourceVersion=gone, timeoutSeconds=1
            )
            assert json.loads(answer.splitlines()[0])["object"]["code"] == 410, answer
            assert namespaces.problem is None
            # The thread goes on: a namespace made now is seen, each namespace once.
            plane.admin.create(NAMESPACES, {"metadata": {"name": "after-gone"}})
            wait_until(
                lambda: sorted(n["metadata"]["name"] for n in namespaces.items()),
                30,
                POLL,
                "namespace after-gone",
                until=lambda names: "after-gone" in names and len(names) == len(set(names)),
            )
        finally:
            namespaces.stop()
            api.close()


def test_an_api_server_that_never_answers_fails_a_call_in_time_with_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen API server (or a dead proxy in front of one) accepts the connection and says
    nothing: a call gives up after the read timeout instead of holding a start forever."""
    monkeypatch.setattr(cluster_module, "REQUEST_TIMEOUT", (2.0, 2.0))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; nobody reads or answers
        host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        configuration = k8s_client.Configuration()
        configuration.host = host
        api = Cluster("kernels", configuration=configuration)
        began = time.monotonic()
        try:
            with pytest.raises(ClusterError) as raised:
                api.create_pod({"metadata": {"name": "p"}, "spec": {"containers": []}})
        finally:
            api.close()
    assert (
        str(raised.value) == f"cannot reach the Kubernetes API at {host} to create pod p: no answer in time."
    )
    assert time.monotonic() - began < 30
