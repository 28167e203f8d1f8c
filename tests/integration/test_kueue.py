"""Kueue on the test cluster (tests/cluster/kueue.py): the controller built from its Go module,
with its own CRDs, webhooks and ClusterRole, against the real control plane, queueing plain
pods by GPU quota on simulated nodes that advertise NVIDIA's ``nvidia.com/gpu``.

Kueue runs for the module (managing the module's namespace only); each test makes its own
queues and removes them, while Kueue still runs (its finalizers need it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixture import KubeCluster
from tests.cluster.kueue import QUEUE_LABEL, SCHEDULING_GATE, Kueue, gpu_queues, in_namespaces
from tests.cluster.nodes import device_plugin_nodes
from tests.cluster.rest import (
    CLUSTER_QUEUES,
    MUTATING_WEBHOOKS,
    PODS,
    WORKLOADS,
    ApiError,
    kind_of,
)

from ..support.polling import wait_until
from .conftest import MakeKube

pytestmark = pytest.mark.integration

DEADLINE = 120.0  # seconds: Kueue, the scheduler and the node side all act on a loaded machine
SERVE = "import time\ntime.sleep(600)"


@pytest.fixture(scope="module")
def kueue(
    control_plane: ControlPlane, kube_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kueue]:
    with Kueue(
        control_plane, tmp_path_factory.mktemp("kueue"), namespaces=in_namespaces(kube_namespace)
    ) as running:
        yield running


@pytest.fixture
def queues(kueue: Kueue, make_kube: MakeKube) -> Iterator[KubeCluster]:
    """Two simulated nodes with one ``nvidia.com/gpu`` each, and a ClusterQueue holding one GPU
    with a LocalQueue ``gpu`` in the test's namespace: the nodes fit two pods, the quota one."""
    kube = make_kube(device_plugin_nodes(2))
    made = gpu_queues(kube.namespace, gpus=1)
    for manifest in made:
        kube.admin.apply(manifest)
    yield kube
    for pod in kube.pods():  # before the queues: Kueue releases their quota, then the queues go
        kube.remove(PODS, kube.namespace, pod["metadata"]["name"])
    wait_until(kube.pods, DEADLINE, message="the test's pods gone", until=lambda pods: pods == [])
    for manifest in reversed(made):
        metadata = manifest["metadata"]
        with contextlib.suppress(ApiError):
            kube.admin.delete(kind_of(manifest), metadata["name"], metadata.get("namespace"))
    wait_until(
        lambda: [m for m in made if kube.admin.get(kind_of(m), m["metadata"]["name"], kube.namespace)],
        DEADLINE,
        message="the test's queues gone (Kueue removes their finalizers)",
        until=lambda left: left == [],
    )


def gpu_pod(name: str, queue: str = "gpu") -> dict[str, Any]:
    """A plain pod for LocalQueue ``queue`` asking one ``nvidia.com/gpu`` (its container runs
    with this Python on a simulated node)."""
    return {
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "-c", SERVE],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "restartPolicy": "Never",
        },
    }


def running_on_a_node(kube: KubeCluster, name: str) -> dict[str, Any]:
    """Wait until pod ``name`` has no scheduling gate, is bound to a node and runs there."""
    return wait_until(
        lambda: kube.get(PODS, name),
        DEADLINE,
        message=f"pod {name} admitted, bound and running",
        until=lambda pod: (
            pod is not None
            and not pod["spec"].get("schedulingGates")
            and pod["spec"].get("nodeName")
            and pod["status"].get("phase") == "Running"
        ),
    )


def workload_of(kube: KubeCluster, pod: str) -> dict[str, Any] | None:
    """The Workload Kueue made for plain pod ``pod`` (owned by it)."""
    for workload in kube.objects(WORKLOADS):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(owner["kind"] == "Pod" and owner["name"] == pod for owner in owners):
            return workload
    return None


def condition(workload: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return next((found for found in conditions if found["type"] == kind), None)


def test_kueue_comes_up_with_its_module_s_crds_and_webhooks(
    kueue: Kueue, control_plane: ControlPlane
) -> None:
    admin = control_plane.admin
    assert kueue.process is not None and kueue.process.poll() is None
    names = [item["metadata"]["name"] for item in admin.list(MUTATING_WEBHOOKS)]
    assert "kueue-mutating-webhook-configuration" in names
    # The conversion webhook serves: a v1beta2 ClusterQueue, stored as v1beta1, reads back in
    # both versions, each with its own name for the cohort (v1beta2 renamed it).
    queue = admin.apply(
        {
            "apiVersion": CLUSTER_QUEUES.api_version,
            "kind": CLUSTER_QUEUES.kind,
            "metadata": {"name": "comes-up"},
            "spec": {"namespaceSelector": {}, "cohortName": "team"},
        }
    )
    try:
        assert queue["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert queue["spec"]["cohortName"] == "team"
        stored = admin.request("GET", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/comes-up")
        assert stored["spec"].get("cohort") == "team", stored["spec"]
    finally:
        admin.delete(CLUSTER_QUEUES, "comes-up")


def test_gpu_quota_admits_one_pod_and_the_second_waits_until_the_first_is_gone(
    queues: KubeCluster,
) -> None:
    kube = queues
    kube.add(PODS, gpu_pod("first"))
    running_on_a_node(kube, "first")
    kube.add(PODS, gpu_pod("second"))

    # The second fits a node (two nodes, one GPU each) but not the quota: Kueue keeps its gate
    # on and says why on its Workload.
    waiting = wait_until(
        lambda: workload_of(kube, "second"),
        DEADLINE,
        message="the second pod's Workload without quota",
        until=lambda workload: (
            (found := condition(workload, "QuotaReserved")) is not None and found["status"] == "False"
        ),
    )
    message = (condition(waiting, "QuotaReserved") or {})["message"]
    print(f"the second pod's Workload: QuotaReserved=False: {message}")
    assert "insufficient unused quota for nvidia.com/gpu" in message, message
    second = kube.get(PODS, "second")
    assert second is not None
    assert SCHEDULING_GATE in [gate["name"] for gate in second["spec"].get("schedulingGates") or []]
    assert not second["spec"].get("nodeName")
    assert (condition(workload_of(kube, "first"), "Admitted") or {}).get("status") == "True"

    kube.remove(PODS, kube.namespace, "first")
    second = running_on_a_node(kube, "second")
    assert second["spec"]["nodeName"] in {"gpu-node-1", "gpu-node-2"}
    assert (condition(workload_of(kube, "second"), "Admitted") or {}).get("status") == "True"


def page_documents() -> list[dict[str, Any]]:
    """The Kubernetes objects of docs/admins/kueue.md's ``yaml`` blocks, in order."""
    from markdown_it import MarkdownIt

    page = Path(__file__).resolve().parents[2] / "docs" / "admins" / "kueue.md"
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    blocks = [t.content for t in tokens if t.type == "fence" and t.info.split()[:1] == ["yaml"]]
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if isinstance(doc, dict)]


def test_the_kueue_pages_objects_are_what_the_tests_run_kueue_with(kueue: Kueue) -> None:
    """docs/admins/kueue.md's queues are the ones the tests apply to the API server (where
    Kueue's CRDs and webhooks check them), and its Configuration is the one Kueue runs with, in
    the page's namespace: the page shows nothing the tests did not run."""
    documents = page_documents()
    [configuration] = [doc for doc in documents if doc["kind"] == "Configuration"]
    running = yaml.safe_load((kueue.directory / "config.yaml").read_text())
    assert configuration["apiVersion"] == running["apiVersion"]
    assert configuration["integrations"] == running["integrations"]
    assert configuration["managedJobsNamespaceSelector"] == in_namespaces("jupyter-kernels")
    queues = [doc for doc in documents if doc["kind"] != "Configuration"]
    assert queues == gpu_queues("jupyter-kernels", gpus=4)
