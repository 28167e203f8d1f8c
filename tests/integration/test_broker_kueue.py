"""The GPU broker on a Kueue cluster (issue 41): the hub and broker of test_broker_kubernetes.py,
the broker's ``c.GPUShare.kueue_queue`` set, Kueue (tests/cluster/kueue.py) queueing its kernel
pods by GPU quota.

Two simulated nodes with one time-sliced 80 GiB card each (two ``nvidia.com/gpu`` shares), a
ClusterQueue of one ``nvidia.com/gpu``: the nodes hold a 60G slice each, the quota one pod. The
broker keeps no queue of its own in front of Kueue's: it creates each pod at once, counts no pod
Kueue holds as taking node room, and its starts say Kueue's reason.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name

from ..cluster import ControlPlane
from ..cluster.kueue import SCHEDULING_GATE, Kueue, broker_grants, gpu_queues
from ..cluster.nodes import SimNode, gfd_labels
from ..cluster.rest import PODS
from ..support.polling import wait_until
from .conftest import module_kube
from .test_broker_kubernetes import Setup, call, hub_and_broker, running, user_token
from .test_kueue import NO_QUOTA, applied, condition, workload_of

pytestmark = pytest.mark.integration

DEADLINE = 120.0  # seconds: Kueue, the scheduler, the node side and the hub on a loaded machine
KERNELSPECS = {"gpu-60g": {"gpu_memory": "60G", "gpu_mode": "timeslice"}}


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, kube_namespace: str, kueue: Kueue
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("broker-kueue")
    labels = {**gfd_labels(replicas=2), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    nodes = [SimNode(f"gpu-node-{n}", {"nvidia.com/gpu": "2"}, labels) for n in (1, 2)]
    with (
        module_kube(control_plane, kube_namespace, root / "cluster", nodes) as cluster,
        applied(cluster, gpu_queues(cluster.namespace, gpus=1)),
        hub_and_broker(root, cluster, KERNELSPECS, "nvidia", {"kueue_queue": "gpu"}) as made,
    ):
        yield made


def gated_pod(setup: Setup, kernel_id: str) -> dict[str, Any]:
    """The kernel's pod once it exists behind Kueue's gate."""
    return dict(
        wait_until(
            lambda: setup.cluster.get(PODS, pod_name(kernel_id)),
            DEADLINE,
            message=f"kernel {kernel_id}'s pod created, behind Kueue's gate",
            until=lambda pod: (
                pod is not None
                and SCHEDULING_GATE in [gate["name"] for gate in pod["spec"].get("schedulingGates") or []]
            ),
        )
    )


def waiting_in_kueues_words(setup: Setup, kernel_id: str) -> dict[str, Any]:
    answer = wait_until(
        lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}"),
        DEADLINE,
        message=f"kernel {kernel_id} waiting with Kueue's reason",
        until=lambda got: got[0] == 200 and NO_QUOTA in (got[1].get("detail") or ""),
    )
    return dict(answer[1])


def shut_down(setup: Setup, kernel_id: str) -> None:
    """Shut a running kernel down through jupyter_server, which knows a pod kernel a moment
    after its pod runs (once the kernel answered): until then it answers 404."""
    route, token = f"/user/alice/api/kernels/{kernel_id}", user_token(setup, "alice")
    wait_until(
        lambda: setup.hub.call("DELETE", route, token=token),
        DEADLINE,
        message=f"kernel {kernel_id} shut down by jupyter_server",
        until=lambda answer: answer[0] == 204,
    )


def test_the_broker_leaves_the_queue_to_kueue_and_its_starts_say_kueues_reason(setup: Setup) -> None:
    """The first kernel runs; the second and third fit the nodes' memory as the broker sees it,
    not Kueue's quota: their pods are created at once and wait behind Kueue's gate (the second
    takes no node room in the broker's view, so the third is not held in the broker's queue),
    each start saying Kueue's reason from its Workload. Once the first kernel is shut down,
    Kueue admits the second and it runs, then the third once the second is."""
    kernels = []
    for _ in range(3):
        status, body = call(setup, "alice", "POST", "kernels", {"name": "gpu-60g"})
        assert status in (201, 202), (status, body, setup.log()[-3000:])
        kernels.append(body["kernel_id"])
        if len(kernels) == 1:
            running(setup, "alice", kernels[0])
    first, second, third = kernels

    for place, kernel_id in enumerate((second, third), start=1):
        assert not gated_pod(setup, kernel_id)["spec"].get("nodeName")
        waiting_in_kueues_words(setup, kernel_id)
        message = (condition(workload_of(setup.cluster, pod_name(kernel_id)), "QuotaReserved") or {})[
            "message"
        ]
        # With its place in Kueue's queue (the visibility API, read once a second for all).
        said = f"pending: queued by Kueue in LocalQueue gpu (position {place} of 2): {message}"
        view = wait_until(
            lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}")[1],  # noqa: B023
            DEADLINE,
            message=f"kernel {kernel_id} at position {place} in Kueue's queue",
            until=lambda view: view.get("detail") == said,  # noqa: B023
        )
        print(f"kernel {kernel_id} waits: {view['detail']}")
        assert view["state"] == "queued", view

    # Kueue admits in the order the pods were made: the second, then (the second gone) the third.
    for before, after in ((first, second), (second, third)):
        shut_down(setup, before)
        assert running(setup, "alice", after)["node"] in {"gpu-node-1", "gpu-node-2"}
        admitted = condition(workload_of(setup.cluster, pod_name(after)), "Admitted") or {}
        assert admitted.get("status") == "True"
    shut_down(setup, third)
    wait_until(setup.cluster.pods, DEADLINE, message="no kernel pod left", until=lambda pods: pods == [])


def test_a_kernel_kueue_holds_is_told_its_wait_and_the_estimate_is_judged(setup: Setup) -> None:
    """Five kernels held and shut down (and the first test's three) give the broker's accounting
    finished holds to go by;
    then, the shipped broker Role's Kueue rules granted (the ClusterQueue behind the LocalQueue),
    a kernel Kueue holds behind a running one is told when it is expected to start: its view's
    ``expected_start`` and ``wait …`` in Kueue's words. Its first estimates are kept in the
    broker's file and judged once Kueue admits it (the accounting's triggers)."""
    accounting = setup.root / "broker-runtime" / "gpushare-broker-accounting.sqlite"
    with applied(setup.cluster, broker_grants(setup.cluster.namespace)):
        for _ in range(5):
            status, body = call(setup, "alice", "POST", "kernels", {"name": "gpu-60g"})
            assert status in (201, 202), body
            running(setup, "alice", body["kernel_id"])
            shut_down(setup, body["kernel_id"])
        first = call(setup, "alice", "POST", "kernels", {"name": "gpu-60g"})[1]["kernel_id"]
        running(setup, "alice", first)
        second = call(setup, "alice", "POST", "kernels", {"name": "gpu-60g"})[1]["kernel_id"]
        view = wait_until(
            lambda: call(setup, "alice", "GET", f"kernels/{second}")[1],
            DEADLINE,
            message=f"kernel {second} told its wait",
            until=lambda view: (
                view.get("expected_start") is not None
                and "(position 1 of 1; wait " in (view.get("detail") or "")
            ),
        )
        print(f"kernel {second} waits: {view['detail']}; expected at {view['expected_start']:.0f}")
        assert view["state"] == "queued" and NO_QUOTA in view["detail"]
        assert view["expected_start"] > time.time() - 60  # not a wait that has passed long ago
        with sqlite3.connect(accounting) as db:
            assert [row[0] for row in db.execute("SELECT kernel_id FROM acct_estimates")] == [second]
        shut_down(setup, first)
        running(setup, "alice", second)
        wait_until(
            lambda: (
                sqlite3.connect(accounting)
                .execute("SELECT model, naive, placed_at FROM acct_judged")
                .fetchall()
            ),
            DEADLINE,
            message="the kernel's estimates judged once it was placed",
            until=lambda judged: len(judged) == 1,
        )
        shut_down(setup, second)
