"""The GPU broker through API-server faults, on a control plane of this module's own (:mod:`.faults`).

``jupyter gpushare broker --backend kubernetes`` as test_broker_kubernetes.py runs it (a real
JupyterHub, the shipped RBAC, the broker the only holder of a kubeconfig) and alice's single-user
server using it hold kernel pods while kube-apiserver is restarted mid-watch, answers a resumed
watch 410 Gone, is unreachable for 20 s, and is frozen (SIGSTOP) for 20 s. Each time the broker
must relist and go on: each kernel listed once and its reservation counted once in the pool, no
kernel lost (a running kernel runs code throughout), a start during the fault refused with one
sentence, starts after it running.

The control plane runs without the API server's watch cache and with etcd compacting every
second, so a watch resumed from a version a few seconds old is answered 410 Gone; the broker runs
with watches of 2 s (it resumes them often) and API timeouts of 5 s / 10 s (the shipped 10 s /
60 s would outlast a 20 s freeze), set in the broker's process before it starts.
"""

from __future__ import annotations

import asyncio
import collections
import re
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane, hami_nodes
from ..support.polling import wait_until
from ..support.servers import execute
from .conftest import module_kube
from .faults import api_server_down, api_server_frozen, own_control_plane, runs_code_throughout
from .test_broker_kubernetes import Setup, call, hub_and_broker, server_of

pytestmark = pytest.mark.integration

SLICE = 6 * GiB  # what kernelspec gpu-6g-vgpu reserves
REQUEST_TIMEOUT = (5.0, 10.0)  # the broker's API timeouts here (connect, answer), seconds
# The broker's command line, with shorter watches and API timeouts than shipped.
LAUNCHER = (
    sys.executable,
    "-c",
    "import sys\n"
    "from jupyter_gpushare.backends.kubernetes.cluster import cluster, watch\n"
    "watch.WATCH_SECONDS = 2\n"
    f"cluster.REQUEST_TIMEOUT = {REQUEST_TIMEOUT!r}\n"
    "from jupyter_gpushare.cli import main\n"
    "sys.exit(main())\n",
)


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (the tests stop, freeze and restart it)."""
    with own_control_plane(tmp_path_factory.mktemp("faulty-plane"), compacting=True) as plane:
        yield plane


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, kube_namespace: str
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("broker-faults")
    nodes = hami_nodes(1, gpumem_mib=16384, card_mib=16384)
    kernelspecs = {"gpu-6g-vgpu": {"gpu_memory": "6G", "gpu_mode": "vgpu"}}
    with (
        module_kube(control_plane, kube_namespace, root / "cluster", nodes) as cluster,
        hub_and_broker(root, cluster, kernelspecs, "hami", {}, launcher=LAUNCHER) as made,
    ):
        yield made


def start_kernel(setup: Setup) -> str:
    """Alice's new 6G kernel, once the broker says it runs."""
    status, body = call(setup, "alice", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    assert status in (201, 202), (status, body, setup.log()[-3000:])
    kernel_id = str(body["kernel_id"])
    wait_until(
        lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}"),
        timeout=120,
        message=f"kernel {kernel_id} running",
        until=lambda answer: answer[0] == 200 and answer[1]["state"] == "running",
    )
    return kernel_id


def kernel_ids(setup: Setup) -> list[str]:
    """Alice's kernels as her server lists them from the broker, once the pool her server shows
    counts what they reserve (each a 6G slice; the pool follows the broker's next event) — and
    never more than that: nothing counted twice."""
    status, kernels = call(setup, "alice", "GET", "kernels")
    assert status == 200, kernels
    listed = sorted(kernel["kernel_id"] for kernel in kernels)

    def reserved() -> int:
        status, pool = call(setup, "alice", "GET", "pool")
        assert status == 200, pool
        held = sum(device["memory_reserved"] for device in pool["devices"])
        assert held <= len(listed) * SLICE, (listed, pool)
        return int(held)

    wait_until(
        reserved,
        timeout=60,
        message=f"the pool counting {len(listed)} kernel(s) of 6G",
        until=lambda held: held == len(listed) * SLICE,
    )
    return listed


def quiet_log_since(setup: Setup, offset: int) -> None:
    """What the broker logged from ``offset`` on: sentences, no traceback (an API away is a
    fault the broker expects), and its housekeeping's sentence once a minute at most, not once a
    round (every 2 s; these faults last a minute or two)."""
    written = setup.log()[offset:]
    assert "Traceback" not in written, written[-4000:]
    said = collections.Counter(re.findall(r"GPU broker housekeeping: (.*)", written))
    assert all(times <= 3 for times in said.values()), said


def runs_code(setup: Setup, kernel_id: str) -> Any:
    return lambda: execute(server_of(setup, "alice"), kernel_id, "print(6 * 7)")


def refused_start(setup: Setup) -> str:
    """A start posted now, and the sentence it fails with (at once, or once the broker gave up)."""
    status, body = call(setup, "alice", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    if status in (201, 202):  # answered "starting": the failure comes with a later look
        kernel_id = body["kernel_id"]
        status, body = wait_until(
            lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}"),
            timeout=90,
            message=f"the start of {kernel_id} failing",
            until=lambda answer: answer[0] >= 400,
        )
    assert status == 503, (status, body)
    return str(body["message"])


def stop_kernels(setup: Setup, kernel_ids: list[str]) -> None:
    token = setup.tokens["alice"]
    for kernel_id in kernel_ids:
        assert setup.hub.call("DELETE", f"/user/alice/api/kernels/{kernel_id}", token=token)[0] == 204
    wait_until(
        lambda: sorted(pod["metadata"]["name"] for pod in setup.cluster.pods()),
        timeout=60,
        message="the kernels' pods gone",
        until=lambda names: not set(names) & {pod_name(kernel_id) for kernel_id in kernel_ids},
    )


def test_a_watch_answered_410_gone_relists_and_the_broker_goes_on(setup: Setup) -> None:
    first = start_kernel(setup)
    # The broker's 2 s watches resume from their last version; with nothing changing, etcd has
    # compacted it away by then, and the API server answers 410 Gone: the broker lists again.
    relisted = "Watching kernel pods in namespace"
    wait_until(
        lambda: setup.log(),
        timeout=60,
        message="the broker relisting kernel pods after a 410 Gone",
        until=lambda log: re.search(rf"{relisted} \S+: its version is gone \(410 Gone\)", log) is not None,
    )
    assert kernel_ids(setup) == [first]
    second = start_kernel(setup)
    assert kernel_ids(setup) == sorted([first, second])  # each once
    assert asyncio.run(runs_code(setup, first)()) == ("42\n", "")
    stop_kernels(setup, [first, second])


def test_a_restarted_api_server_is_relisted_and_nothing_is_counted_twice_or_lost(
    setup: Setup, control_plane: ControlPlane
) -> None:
    first = start_kernel(setup)
    control_plane.down()
    control_plane.start()
    # A start after the restart is seen running only through the broker's relisted pods.
    second = start_kernel(setup)
    assert kernel_ids(setup) == sorted([first, second])
    assert asyncio.run(runs_code(setup, first)()) == ("42\n", "")
    stop_kernels(setup, [first, second])


def alices_pool_problem(setup: Setup, until: Any) -> str | None:
    """The ``problem`` of the pool alice's server shows (from the broker), once ``until`` holds."""

    def problem() -> str | None:
        status, pool = call(setup, "alice", "GET", "pool")
        assert status == 200, pool
        return pool.get("problem")

    return wait_until(problem, timeout=60, message="the pool's problem", until=until)


def test_while_the_api_server_is_gone_the_pool_says_why_through_the_broker(
    setup: Setup, control_plane: ControlPlane
) -> None:
    """No kernel runs: only the broker's watch noticing the API gone can move the marker that
    the broker's stream and alice's server cache the pool on."""
    alices_pool_problem(setup, until=lambda problem: problem is None)  # current before the fault
    with api_server_down(control_plane):
        problem = alices_pool_problem(setup, until=lambda problem: problem is not None)
        assert str(problem).startswith("cannot reach the Kubernetes API to watch "), problem
    alices_pool_problem(setup, until=lambda problem: problem is None)


def through(setup: Setup, fault: AbstractContextManager[float], why: str) -> None:
    """A running kernel through ``fault``: a start meanwhile fails in time with one sentence
    (the API ``why`` unreachable), the kernel runs code throughout and is listed and counted
    once, the broker's log stays sentences; afterwards a start runs and the kernel still does."""
    running = start_kernel(setup)
    host = setup.cluster.url
    logged = len(setup.log())
    with fault as since:
        began = time.monotonic()
        message = refused_start(setup)
        took = time.monotonic() - began
        assert re.fullmatch(
            r"the kernel pod could not be created: cannot reach the Kubernetes API at "
            rf"{re.escape(host)} to create Secret gpushare-kernel-[0-9a-f-]+-conn: {why}\.",
            message,
        ), message
        # The kernel runs on: its pod's process and its sockets need no API server.
        asyncio.run(runs_code_throughout(runs_code(setup, running), since))
        assert kernel_ids(setup) == [running]  # the broker's last view stays
    assert took < 60, took
    quiet_log_since(setup, logged)
    # The API answers again: the broker's watches resume (or list again), starts run.
    after = start_kernel(setup)
    assert kernel_ids(setup) == sorted([running, after])
    assert asyncio.run(runs_code(setup, running)()) == ("42\n", "")
    stop_kernels(setup, [running, after])


def test_while_the_api_server_is_gone_starts_fail_with_one_sentence_and_kernels_run_on(
    setup: Setup, control_plane: ControlPlane
) -> None:
    through(setup, api_server_down(control_plane), "connection refused")


def test_a_frozen_api_server_fails_a_start_in_time_and_everything_recovers(
    setup: Setup, control_plane: ControlPlane
) -> None:
    """SIGSTOP: connections are accepted (the kernel's backlog), nothing answers; the start's
    request gives up after the broker's timeouts."""
    through(setup, api_server_frozen(control_plane), "no answer in time")
