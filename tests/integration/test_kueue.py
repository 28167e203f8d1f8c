"""Kueue on the test cluster (tests/cluster/kueue.py): the controller built from its Go module,
with its own CRDs, webhooks and ClusterRole, against the real control plane, queueing plain
pods by GPU quota on simulated nodes that advertise NVIDIA's ``nvidia.com/gpu``; and kernel pods
of a real ``jupyter server`` with ``c.GPUShare.kueue_queue``, queued the same way.

Kueue runs for the module (managing the module's namespace only); each test makes its own
queues and removes them, while Kueue still runs (its finalizers need it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixture import TEST_RBAC, KubeCluster, shipped_rbac
from tests.cluster.kueue import (
    QUEUE_LABEL,
    SCHEDULING_GATE,
    Kueue,
    cohort_queues,
    gpu_queues,
    in_namespaces,
)
from tests.cluster.nodes import device_plugin_nodes
from tests.cluster.rest import (
    CLUSTER_QUEUES,
    EVENTS,
    MUTATING_WEBHOOKS,
    PODS,
    ROLES,
    WORKLOADS,
    ApiError,
    kind_of,
)

from ..support.kernels import write_kernelspec
from ..support.nodes import IMAGE, Node
from ..support.polling import async_wait_until, wait_until
from ..support.servers import JupyterServer, execute
from .conftest import MakeKube
from .kubernetes_server.support import POLL, get, running_view, server_for, start
from .test_doctor_cluster import doctor
from .test_kubernetes import nothing_left

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
DEADLINE = 120.0  # seconds: Kueue, the scheduler and the node side all act on a loaded machine
SERVE = "import time\ntime.sleep(600)"


@pytest.fixture
def queues(kueue: Kueue, make_kube: MakeKube) -> Iterator[KubeCluster]:
    """Two simulated nodes with one ``nvidia.com/gpu`` each, and a ClusterQueue holding one GPU
    with a LocalQueue ``gpu`` in the test's namespace: the nodes fit two pods, the quota one."""
    kube = make_kube(device_plugin_nodes(2))
    with applied(kube, gpu_queues(kube.namespace, gpus=1)):
        yield kube


@pytest.fixture
def cohort(kueue: Kueue, make_kube: MakeKube) -> Iterator[KubeCluster]:
    """Three simulated nodes with one ``nvidia.com/gpu`` each, and two ClusterQueues in one
    cohort holding one GPU each, with LocalQueues ``team-a`` and ``team-b``: the nodes fit three
    pods, the cohort two, each team one of its own."""
    kube = make_kube(device_plugin_nodes(3))
    with applied(kube, cohort_queues(kube.namespace)):
        yield kube


@contextlib.contextmanager
def applied(kube: KubeCluster, made: list[dict[str, Any]]) -> Iterator[None]:
    """Kueue's objects ``made`` for the test; then its pods go first (Kueue releases their quota),
    then the objects, while Kueue still runs (their finalizers are Kueue's)."""
    for manifest in made:
        kube.admin.apply(manifest)
    try:
        yield
    finally:
        remove_queues(kube, made)


def remove_queues(kube: KubeCluster, made: list[dict[str, Any]]) -> None:
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
    # The cohort's ClusterQueues use the ResourceFlavor shown first.
    assert queues == [*gpu_queues("jupyter-kernels", gpus=4), *cohort_queues("jupyter-kernels")[1:]]


# -- kernel pods through a jupyter server -----------------------------------------------------------

GRACE = 2.0  # c.KubernetesProvisioner.unschedulable_grace: short, so the test sees it pass
NO_QUOTA = "insufficient unused quota for nvidia.com/gpu in flavor default-flavor"


def view_of(server: JupyterServer, kernel_id: str) -> dict[str, Any]:
    return dict(get(server, f"kernels/{kernel_id}"))


def drop_workloads_rule(kube: KubeCluster) -> None:
    """The shipped Role without its Kueue rules, ``list workloads`` and ``get
    localqueues/pendingworkloads`` (a cluster whose admin left them out)."""
    [role] = [doc for doc in shipped_rbac(kube.namespace, ("rbac.yaml",)) if doc["kind"] == "Role"]
    role["rules"] = [rule for rule in role["rules"] if "kueue" not in rule["apiGroups"][0]]
    kube.admin.apply(role)


@contextlib.contextmanager
def role_without(kube: KubeCluster, dropped: Any) -> Iterator[None]:
    """The shipped Role without the rules ``dropped`` picks, then the shipped Role again."""
    [role] = [doc for doc in shipped_rbac(kube.namespace, ("rbac.yaml",)) if doc["kind"] == "Role"]
    role["rules"] = [rule for rule in role["rules"] if not dropped(rule)]
    kube.admin.apply(role)
    try:
        yield
    finally:
        for manifest in shipped_rbac(kube.namespace, ("rbac.yaml",)):
            if kind_of(manifest) == ROLES:
                kube.admin.apply(manifest)


def test_doctor_reads_kueues_workloads_as_the_servers_service_account(
    queues: KubeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With Kueue and the shipped Role, the doctor's Kueue line is OK; without the Role's
    ``list workloads`` rule, or its ``get localqueues/pendingworkloads``, it warns (kernels still
    wait, saying less), naming the fix."""
    kube = queues
    _, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys, kueue_queue="gpu")
    assert found["Kueue"] == {
        "name": "Kueue",
        "status": "OK",
        "detail": "kernels wait in LocalQueue gpu; Kueue's Workloads and their places are readable",
        "fix": "",
    }
    with role_without(kube, lambda rule: rule["apiGroups"] == ["kueue.x-k8s.io"]):
        exit_code, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys, kueue_queue="gpu")
    assert found["Kueue"]["status"] == "WARN", found["Kueue"]
    assert found["Kueue"]["detail"].endswith(
        f"not allowed to list workloads.kueue.x-k8s.io in namespace {kube.namespace}"
    )
    assert "rbac.yaml (workloads: list)" in found["Kueue"]["fix"]
    assert exit_code == 0
    # Without the place's rule only: the reason is shown, the place is not.
    with role_without(kube, lambda rule: "localqueues/pendingworkloads" in rule["resources"]):
        _, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys, kueue_queue="gpu")
    assert found["Kueue"]["status"] == "WARN", found["Kueue"]
    assert found["Kueue"]["detail"].endswith(
        "not allowed to get localqueues/pendingworkloads.visibility.kueue.x-k8s.io in namespace "
        + kube.namespace
    )
    assert "(localqueues/pendingworkloads: get)" in found["Kueue"]["fix"]


async def test_a_kernel_waits_for_kueues_quota_with_kueues_words_then_starts(
    node: Node, queues: KubeCluster
) -> None:
    """Quota for one GPU, two nodes with one each: the first kernel is admitted and runs; the
    second's pod waits behind Kueue's gate, its start past the unschedulable grace, saying
    Kueue's reason (or, with no right to read Workloads, that Kueue holds it); once the first
    kernel is shut down, the second is admitted and starts."""
    kube = queues
    write_kernelspec(node, "gpu-whole", {"gpu_memory": "whole", "gpu_mode": "exclusive"})
    server = await asyncio.to_thread(
        server_for,
        node,
        kube,
        "k8s-kueue",
        {"unschedulable_grace": GRACE},
        resource_preset="nvidia",
        kueue_queue="gpu",
    )
    try:
        first = (await asyncio.to_thread(start, server, {"name": "gpu-whole"}))["kernel_id"]
        await asyncio.to_thread(running_view, server, first, DEADLINE)
        pod = kube.get(PODS, pod_name(first))
        assert pod is not None and pod["metadata"]["labels"][QUEUE_LABEL] == "gpu"
        assert (condition(workload_of(kube, pod_name(first)), "Admitted") or {}).get("status") == "True"

        second = (await asyncio.to_thread(start, server, {"name": "gpu-whole"}))["kernel_id"]
        waiting = await asyncio.to_thread(
            wait_until,
            lambda: view_of(server, second),
            DEADLINE,
            POLL,
            "the second kernel waiting with Kueue's reason",
            until=lambda view: NO_QUOTA in (view.get("detail") or ""),
        )
        seen_at = time.monotonic()
        print(f"the second kernel waits: {waiting['detail']}")
        message = (condition(workload_of(kube, pod_name(second)), "QuotaReserved") or {})["message"]
        # Its place in Kueue's queue, from Kueue's visibility API (through the API server's
        # aggregator, under the shipped Role): first of one; a third kernel waits behind it.
        waiting = await asyncio.to_thread(
            wait_until,
            lambda: view_of(server, second),
            DEADLINE,
            POLL,
            "the second kernel's place in Kueue's queue",
            until=lambda view: (
                view.get("detail")
                == f"pending: queued by Kueue in LocalQueue gpu (position 1 of 1): {message}"
            ),
        )
        third = (await asyncio.to_thread(start, server, {"name": "gpu-whole"}))["kernel_id"]
        for kernel_id, place in ((third, "position 2 of 2"), (second, "position 1 of 2")):
            await asyncio.to_thread(
                wait_until,
                lambda: view_of(server, kernel_id),  # noqa: B023
                DEADLINE,
                POLL,
                f"{place} in Kueue's queue",
                until=lambda view: f"LocalQueue gpu ({place}): " in (view.get("detail") or ""),  # noqa: B023
            )
        withdrawn = await asyncio.to_thread(server.request, "DELETE", f"/api/gpushare/kernels/{third}/gpu")
        assert withdrawn.status in (200, 204), withdrawn.body
        await asyncio.to_thread(
            wait_until,
            lambda: view_of(server, second),
            DEADLINE,
            POLL,
            "first of one again, the third withdrawn",
            until=lambda view: "LocalQueue gpu (position 1 of 1): " in (view.get("detail") or ""),
        )
        gated = kube.get(PODS, pod_name(second))
        assert gated is not None and not gated["spec"].get("nodeName")
        assert SCHEDULING_GATE in [gate["name"] for gate in gated["spec"].get("schedulingGates") or []]

        # Well past the grace an unschedulable pod gets, still waiting (not failed), still saying so.
        later = await asyncio.to_thread(
            wait_until,
            lambda: (time.monotonic(), server.request("GET", f"/api/gpushare/kernels/{second}")),
            DEADLINE,
            POLL,
            "a look at the second kernel after the unschedulable grace",
            until=lambda seen: seen[0] - seen_at > 3 * GRACE or seen[1].status != 200,
        )
        assert later[1].status == 200, later[1].body
        assert later[1].body["state"] == "queued" and NO_QUOTA in later[1].body["detail"], later[1].body

        # Without the right to read Workloads and places: Kueue still holds it, said plainly.
        drop_workloads_rule(kube)
        try:
            plain = await asyncio.to_thread(
                wait_until,
                lambda: view_of(server, second),
                DEADLINE,
                POLL,
                "the plain sentence once Workloads are forbidden",
                until=lambda view: (
                    view.get("detail")
                    == "pending: queued by Kueue in LocalQueue gpu: waiting for its admission"
                ),
            )
            assert plain["state"] == "queued"
            assert "Kueue's reason is not shown" in server.log()
            assert "the position in Kueue's queue is not shown" in server.log()
        finally:
            for manifest in shipped_rbac(kube.namespace, ("rbac.yaml",)):
                if kind_of(manifest) == ROLES:
                    kube.admin.apply(manifest)

        stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{first}")
        assert stopped.status == 204, stopped.body
        started = await asyncio.to_thread(running_view, server, second, DEADLINE)
        assert started["node"] in {"gpu-node-1", "gpu-node-2"}
        assert (condition(workload_of(kube, pod_name(second)), "Admitted") or {}).get("status") == "True"
        await asyncio.to_thread(  # the pod runs a moment before the kernel manager has the kernel
            wait_until,
            lambda: server.request("GET", f"/api/kernels/{second}").status,
            DEADLINE,
            POLL,
            "the second kernel started",
            until=lambda status: status == 200,
        )
        stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{second}")
        assert stopped.status == 204, stopped.body
        await nothing_left(kube)
    finally:
        await asyncio.to_thread(server.stop)


# -- two teams in one cohort ----------------------------------------------------------------------

PREEMPTED = "preempted by Kueue: Preempted to accommodate a workload (UID: "


def gpus_reserved(kube: KubeCluster, cluster_queue: str) -> tuple[str, str]:
    """``(total, borrowed)`` of ``nvidia.com/gpu`` Kueue has reserved in ``cluster_queue``."""
    queue = kube.admin.get(CLUSTER_QUEUES, cluster_queue) or {}
    for flavor in (queue.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] == "nvidia.com/gpu":
                return str(resource.get("total", "0")), str(resource.get("borrowed", "0"))
    return "0", "0"


def said_of(server: JupyterServer, kernel_id: str) -> str:
    """All a kernel's view says: its state, detail and warnings."""
    view = view_of(server, kernel_id)
    return " | ".join([str(view.get("state")), str(view.get("detail")), *(view.get("warnings") or [])])


async def test_two_teams_borrow_in_a_cohort_and_a_preempted_kernel_says_so_in_kueues_words(
    node: Node, cohort: KubeCluster
) -> None:
    """Two ClusterQueues of one GPU each in a cohort, a jupyter server per team (LocalQueues
    team-a and team-b), three nodes of one GPU each. Team a's two kernels are both admitted, the
    second on team b's unused GPU; then team b starts one: Kueue takes its GPU back by preempting
    a borrowing kernel of team a, whose end says so in Kueue's words (GET kernels, the server's
    log), and which jupyter_server's restarter brings back into a new pod that waits for quota,
    saying Kueue's reason. Team b's kernel runs; the preempted kernel, shut down while its restart
    waits for quota, goes with its pod and Workload (jupyter_client alone answers that shutdown
    500)."""
    kube = cohort
    write_kernelspec(node, "gpu-whole", {"gpu_memory": "whole", "gpu_mode": "exclusive"})
    servers = []
    try:
        for team, owner in (("team-a", "alice"), ("team-b", "bob")):
            servers.append(
                await asyncio.to_thread(
                    server_for,
                    node,
                    kube,
                    f"k8s-{team}",
                    {"unschedulable_grace": GRACE},
                    resource_preset="nvidia",
                    kueue_queue=team,
                    owner=owner,
                )
            )
        team_a, team_b = servers
        a_kernels = []
        for _ in range(2):
            kernel_id = (await asyncio.to_thread(start, team_a, {"name": "gpu-whole"}))["kernel_id"]
            await asyncio.to_thread(running_view, team_a, kernel_id, DEADLINE)
            a_kernels.append(kernel_id)
        # Kueue admitted the second on the cohort's unused quota: team-a borrows team-b's GPU.
        await asyncio.to_thread(  # its status a moment after the admission
            wait_until,
            lambda: gpus_reserved(kube, "team-a"),
            DEADLINE,
            POLL,
            "team-a's ClusterQueue holding two GPUs, one borrowed",
            until=lambda reserved: reserved == ("2", "1"),
        )

        b_kernel = (await asyncio.to_thread(start, team_b, {"name": "gpu-whole"}))["kernel_id"]
        ended = await asyncio.to_thread(
            wait_until,
            lambda: {kernel_id: said_of(team_a, kernel_id) for kernel_id in a_kernels},
            DEADLINE,
            POLL,
            "a kernel of team a preempted, saying so",
            until=lambda said: any(PREEMPTED in text for text in said.values()),
        )
        [preempted] = [kernel_id for kernel_id, text in ended.items() if PREEMPTED in text]
        print(f"the preempted kernel says: {ended[preempted]}")
        assert "due to reclamation within the cohort" in ended[preempted], ended
        await asyncio.to_thread(running_view, team_b, b_kernel, DEADLINE)
        # Kueue's words name the workload it made room for: team b's kernel pod's.
        b_workload = workload_of(kube, pod_name(b_kernel))
        assert b_workload is not None
        assert f"{PREEMPTED}{b_workload['metadata']['uid']}," in ended[preempted], ended[preempted]
        assert f"pod {pod_name(preempted)} ended: {PREEMPTED}" in team_a.log()
        [kept] = [kernel_id for kernel_id in a_kernels if kernel_id != preempted]
        assert view_of(team_a, kept)["state"] == "running"

        # Restarted by jupyter_server into a new pod, which waits in team-a for quota, saying why.
        waiting = await asyncio.to_thread(
            wait_until,
            lambda: view_of(team_a, preempted),
            DEADLINE,
            POLL,
            "the preempted kernel's new pod waiting for quota with Kueue's reason",
            until=lambda view: "insufficient unused quota for nvidia.com/gpu" in (view.get("detail") or ""),
        )
        print(f"the preempted kernel waits: {waiting['detail']} {waiting['warnings']}")
        assert waiting["detail"].startswith("pending: queued by Kueue in LocalQueue team-a"), waiting
        assert any(
            warning.startswith(f"the kernel was restarted after it ended: {PREEMPTED}")
            for warning in waiting["warnings"]
        ), waiting
        gated = kube.get(PODS, pod_name(preempted))
        assert gated is not None and SCHEDULING_GATE in [
            gate["name"] for gate in gated["spec"].get("schedulingGates") or []
        ]
        assert gpus_reserved(kube, "team-b")[1] == "0"  # team b borrows nothing: its own GPU

        # The user gives up on it while its restart waits for quota: the shutdown is answered
        # (jupyter_client alone answers 500 while a restart is pending), the waiting pod and its
        # Workload go, and Kueue has nothing of it left to admit.
        stopped = await asyncio.to_thread(team_a.request, "DELETE", f"/api/kernels/{preempted}")
        assert stopped.status == 204, stopped.body
        assert (await asyncio.to_thread(team_a.request, "GET", f"/api/kernels/{preempted}")).status == 404
        await asyncio.to_thread(
            wait_until,
            lambda: (kube.get(PODS, pod_name(preempted)), workload_of(kube, pod_name(preempted))),
            DEADLINE,
            POLL,
            "the abandoned restart's pod and Workload gone",
            until=lambda found: found == (None, None),
        )
        assert "shut down while its pod waited to start" in team_a.log()
        # The kept kernel of team a and team b's kernel run on, and answer.
        for server, kernel_id in ((team_a, kept), (team_b, b_kernel)):
            out, errors = await execute(server, kernel_id, "print(6 * 7)", timeout=DEADLINE)
            assert (out.strip(), errors) == ("42", ""), (out, errors)
        for server, kernel_id in ((team_a, kept), (team_b, b_kernel)):
            stopped = await asyncio.to_thread(server.request, "DELETE", f"/api/kernels/{kernel_id}")
            assert stopped.status == 204, stopped.body
        await nothing_left(kube)
    finally:
        for server in servers:
            await asyncio.to_thread(server.stop)


# -- a JupyterHub server's spawn, queued -----------------------------------------------------------


def hub_rbac(namespace: str) -> list[dict[str, Any]]:
    """What Zero to JupyterHub gives the hub (tests/cluster/rbac/z2jh-hub.yaml) and what
    examples/kubernetes/rbac-hub-kueue.yaml adds, in ``namespace`` (the one Kueue manages here)."""
    documents = [
        document
        for path in (TEST_RBAC / "z2jh-hub.yaml", EXAMPLES / "rbac-hub-kueue.yaml")
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]
    for document in documents:
        document["metadata"]["namespace"] = namespace
        for subject in document.get("subjects") or []:
            subject["namespace"] = namespace
    return documents


async def test_a_queued_hub_servers_spawn_progress_says_kueues_words(
    queues: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU server from gpu_profiles(kueue_queue="gpu"), made by a real KubeSpawner as the hub's
    ServiceAccount (the chart's Role and rbac-hub-kueue.yaml): its pod waits behind Kueue's gate
    while another pod holds the quota, and an event on it says Kueue's words and its place —
    what KubeSpawner's spawn progress shows — until Kueue admits it."""
    import kubernetes_asyncio.config.kube_config as kube_config
    from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
    from kubernetes_asyncio.config import load_kube_config
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config
    from traitlets.config import Config

    from jupyter_gpushare.backends.kubernetes.cluster import spawner_kueue
    from jupyter_gpushare.hub import gpu_profiles

    kube = queues
    for manifest in hub_rbac(kube.namespace):
        kube.admin.apply(manifest)
    blocker = kube.add(PODS, gpu_pod("blocker"))["metadata"]["name"]
    await asyncio.to_thread(running_on_a_node, kube, blocker)
    hub = kube.kubeconfig_for_service_account(kube.namespace, "hub")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(hub))
    load_config.cache_clear()
    configuration = Configuration()
    await load_kube_config(config_file=str(hub), client_configuration=configuration)
    profiles = gpu_profiles(["whole"], "exclusive", preset="nvidia", kueue_queue="gpu", cpu_profile=False)
    config = Config(
        {
            "KubeSpawner": {
                "profile_list": profiles,
                "namespace": kube.namespace,
                "cmd": ["python", "-c", "import time; time.sleep(600)"],
                "image": IMAGE,
                "start_timeout": DEADLINE,
            }
        }
    )
    try:
        async with ApiClient(configuration) as client:
            spawner = KubeSpawner(config=config, _mock=True)
            spawner.api = CoreV1Api(client)
            spawner.user_options = {"profile": "gpu", "gpu": "whole"}
            await spawner.load_user_options()
            created = await spawner.api.create_namespaced_pod(
                kube.namespace, await spawner.get_pod_manifest()
            )
            pod = client.sanitize_for_serialization(created)
            assert pod["metadata"]["labels"][QUEUE_LABEL] == "gpu"
            await spawner.after_pod_created_hook(spawner, pod)
            name = pod["metadata"]["name"]

            def said() -> list[str]:
                return [
                    event["message"]
                    for event in kube.objects(EVENTS)
                    if event["involvedObject"].get("uid") == pod["metadata"]["uid"]
                    and event.get("reason") == spawner_kueue.REASON
                ]

            # (Its first words may come before Kueue's visibility API lists it: then without a place.)
            told = await asyncio.to_thread(
                wait_until,
                said,
                DEADLINE,
                POLL,
                "Kueue's words and the place on the server's pod",
                until=lambda s: any("(position 1 of 1)" in m for m in s),
            )
            message = (condition(workload_of(kube, name), "QuotaReserved") or {})["message"]
            print(f"the server's spawn progress says: {told}")
            assert (
                told[-1]
                == f"Waiting for GPU quota: queued by Kueue in LocalQueue gpu (position 1 of 1): {message}"
            )
            assert NO_QUOTA in told[-1]

            # The quota freed: Kueue admits the server's pod, and the hub stops telling.
            kube.remove(PODS, kube.namespace, blocker)
            await asyncio.to_thread(running_on_a_node, kube, name)
            await async_wait_until(
                lambda: not spawner_kueue._telling, DEADLINE, POLL, "the hub's task ended with the gate"
            )
            assert said() == told  # nothing said once admitted
    finally:
        load_config.cache_clear()
