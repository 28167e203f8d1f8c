"""The Kubernetes backend under Dynamic Resource Allocation, end to end on Kubernetes' own
control plane (tests/cluster/).

Real kernels start through jupyter_client with ``resource_preset`` ``nvidia-dra`` or ``hami-dra``:
the provisioner creates each kernel's pod and its ResourceClaim (owned by the pod) with the
official client, as the Jupyter server's ServiceAccount under the shipped RBAC (rbac.yaml and
rbac-dra.yaml); the real kube-scheduler allocates the claim (its DRA plugin: CEL selectors,
consumable capacity, ``firstAvailable``) from the ResourceSlices the simulated nodes publish as
NVIDIA's or HAMi's driver does, the real garbage collector deletes it with its pod, and a node
runs the pod's command as a local process with the environment the driver gives an allocated
claim. The drivers' node half is stood in for: no device is prepared (CDI, MPS daemons, HAMi-core).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from traitlets.config import Config

from jupyter_gpushare.backends.kubernetes import kubernetes_backend
from jupyter_gpushare.backends.kubernetes.cluster.clients import forget_shared_clusters
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    HOLDER_ANNOTATION,
    claim_name,
    labels,
    pod_name,
)
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import DoesNotFitError
from jupyter_gpushare.core.sizes import GiB

from ..cluster import (
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeCluster,
    dra_nodes,
    hami_driver,
    nvidia_driver,
)
from ..cluster.dra_devices import consumed_per_device
from ..cluster.fixture import TEST_RBAC
from ..support.kernels import kernel_manager, run_cell, write_kernelspec
from ..support.nodes import IMAGE, Node
from ..support.polling import async_wait_until
from .conftest import MakeKube

pytestmark = pytest.mark.integration

# A kernel that only has to be a running process: the concurrency test starts twenty.
IDLE_ARGV = ["python", "-c", "import time; time.sleep(600)", "{connection_file}"]


def manager(preset: str, **gpushare: object) -> AsyncMultiKernelManager:
    settings = {
        "backend": "kubernetes",
        "resource_preset": preset,
        "kernel_image": IMAGE,
        "launch_timeout": 30.0,
        **gpushare,
    }
    config = Config(
        {"GPUShare": settings, "KubernetesProvisioner": {"poll_interval": 0.1, "unschedulable_grace": 0.5}}
    )
    return kernel_manager(config)


def idle_kernelspec(node: Node, name: str, config: dict[str, object]) -> None:
    directory = Path(node.env["JUPYTER_PATH"]) / "kernels" / name
    directory.mkdir(parents=True)
    spec = {
        "argv": IDLE_ARGV,
        "display_name": name,
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpushare-provisioner", "config": config}},
    }
    (directory / "kernel.json").write_text(json.dumps(spec))


@pytest.fixture
def nvidia(node: Node, make_kube: MakeKube) -> Iterator[KubeCluster]:
    """NVIDIA's DRA driver on four nodes: an 80 GiB A100 each, the fourth split into MIG devices."""
    write_kernelspec(node, "gpu-6g-mps", {"gpu_memory": "6G", "gpu_mode": "mps", "gpu_cores": 30})
    write_kernelspec(node, "gpu-200g-exclusive", {"gpu_memory": "200G", "gpu_mode": "exclusive"})
    idle_kernelspec(node, "idle-6g-mig", {"gpu_memory": "6G", "gpu_mode": "mig"})
    yield make_kube(dra_nodes(), driver=nvidia_driver())
    forget_shared_clusters()


@pytest.fixture
def hami(node: Node, make_kube: MakeKube) -> Iterator[KubeCluster]:
    """HAMi's DRA driver on four nodes: an 80 GiB GPU each, memory and cores consumable."""
    idle_kernelspec(node, "idle-24g-vgpu", {"gpu_memory": "24G", "gpu_mode": "vgpu", "gpu_cores": 25})
    yield make_kube(dra_nodes(), driver=hami_driver())
    forget_shared_clusters()


# Single-user servers run where Zero to JupyterHub's release does; rbac-dra.yaml names it jupyter.
HUB_NAMESPACE = "jupyter"


def hub_kubeconfig(cluster: KubeCluster) -> Path:
    return cluster.root / "identities" / "hub.kubeconfig"


@pytest.fixture
def spawner_cluster(hami: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeCluster]:
    """The HAMi cluster, KubeSpawner acting as the hub's ServiceAccount (jupyter/hub) with what
    Zero to JupyterHub's chart grants it and what rbac-dra.yaml adds.

    KubeSpawner loads its kubeconfig once per process (an lru_cache) when first constructed, from
    where kubernetes_asyncio looked at its import ($KUBECONFIG then: unset if a unit test module
    imported it during collection). Point that at the hub's and load afresh, whatever ran before;
    forget it afterwards, so no later spawner is left with a cluster that is gone.
    """
    import kubernetes_asyncio.config.kube_config as kube_config
    from kubespawner.clients import load_config

    hami.apply(TEST_RBAC / "z2jh-hub.yaml")
    config = hami.kubeconfig_for_service_account(HUB_NAMESPACE, "hub", hub_kubeconfig(hami), HUB_NAMESPACE)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    load_config.cache_clear()
    yield hami
    load_config.cache_clear()
    hami.clear(HUB_NAMESPACE)


async def hub_client(cluster: KubeCluster) -> Any:
    """A kubernetes_asyncio ApiClient acting as the hub (as KubeSpawner's own is made)."""
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    configuration = Configuration()
    await load_kube_config(config_file=str(hub_kubeconfig(cluster)), client_configuration=configuration)
    return ApiClient(configuration)


def claims(cluster: KubeCluster) -> list[dict[str, Any]]:  # the test's namespace
    return cluster.objects(RESOURCE_CLAIMS)


async def eventually(condition: Any, timeout: float = 60.0, what: str = "condition") -> None:
    # Generous: a loaded machine's controllers, scheduler and nodes take their time (10 s failed
    # once in a full run, the server pod not yet running).
    await async_wait_until(condition, timeout, 0.05, what)


async def nothing_left(cluster: KubeCluster) -> None:
    await eventually(
        lambda: cluster.pods() == [] and cluster.secrets() == [] and claims(cluster) == [],
        what="no pod, Secret or ResourceClaim",
    )


async def test_a_kernel_starts_through_its_claim_resizes_into_a_new_one_and_leaves_none(
    nvidia: KubeCluster,
) -> None:
    kernels = manager("nvidia-dra")
    states: list[str] = []
    kernel_id = await kernels.start_kernel(kernel_name="gpu-6g-mps", gpushare_on_state=states.append)
    try:
        km = kernels.get_kernel(kernel_id)
        [pod] = nvidia.pods()
        [claim] = claims(nvidia)
        # The pod asks for no extended resource; its container refers to its own claim, which is
        # owned by the pod and was allocated on the node the pod runs on.
        assert claim["metadata"]["name"] == claim_name(kernel_id, 0)
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": claim_name(kernel_id, 0)}
        ]
        assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
        assert [(ref["kind"], ref["uid"]) for ref in claim["metadata"]["ownerReferences"]] == [
            ("Pod", pod["metadata"]["uid"])
        ]
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == "gpu.nvidia.com" and result["device"] == "gpu-0"
        assert result["pool"] == pod["spec"]["nodeName"] != "gpu-node-4"  # not the MIG node
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": pod_name(kernel_id), "uid": pod["metadata"]["uid"]}
        ]
        [config] = claim["status"]["allocation"]["devices"]["config"]
        assert config["opaque"]["parameters"]["sharing"] == {
            "strategy": "MPS",
            "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "6Gi", "defaultActiveThreadPercentage": 30},
        }
        assert states[-1].startswith("running on gpu-node-")

        cell = await run_cell(km, "import os\nprint(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'], 6 * 7)")
        assert cell.stdout == f"{6 * GiB} 42\n"
        # What the driver gives the container for its claim: the allocated card, MPS's limits.
        [device] = [
            device
            for piece in nvidia.objects(RESOURCE_SLICES)
            if piece["spec"]["pool"]["name"] == result["pool"]
            for device in piece["spec"]["devices"]
        ]
        cell = await run_cell(
            km,
            "import os\nfor name in ('NVIDIA_VISIBLE_DEVICES', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', "
            "'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'):\n    print(os.environ[name])",
        )
        assert cell.stdout.split() == [device["attributes"]["uuid"]["string"], "0=6144M", "30"]

        # Resize by restart: a new pod with a claim of its own; the old claim went with its pod.
        km.provisioner.resize_to("12G")
        await kernels.restart_kernel(kernel_id)
        [second] = claims(nvidia)
        assert second["metadata"]["name"] == claim_name(kernel_id, 1)
        assert second["metadata"]["uid"] != claim["metadata"]["uid"]
        [config] = second["status"]["allocation"]["devices"]["config"]
        assert (
            config["opaque"]["parameters"]["sharing"]["mpsConfig"]["defaultPinnedDeviceMemoryLimit"] == "12Gi"
        )
        cell = await run_cell(km, "import os\nprint(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])")
        assert cell.stdout == f"{12 * GiB}\n"
    finally:
        await kernels.shutdown_all()
    await nothing_left(nvidia)


async def test_an_unsatisfiable_claim_fails_the_start_with_the_reason(nvidia: KubeCluster) -> None:
    # An orphan of a server process that is gone: its claim is collected at the first start.
    host = os.uname().nodename
    server_id = f"alice@{host}"
    orphan = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "gpushare-kernel-orphan-gpu-0",
            "namespace": nvidia.namespace,
            "labels": labels("orphan", server_id, "alice"),
            "annotations": {HOLDER_ANNOTATION: f"{host}/999999/1.0"},
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    nvidia.add(RESOURCE_CLAIMS, orphan)
    kernels = manager("nvidia-dra")
    states: list[str] = []
    with pytest.raises(DoesNotFitError) as refused:
        await kernels.start_kernel(kernel_name="gpu-200g-exclusive", gpushare_on_state=states.append)
    message = str(refused.value)
    assert "0/4 nodes are available: 4 cannot allocate all claims." in message
    # The user reads what the claim asked for, not an empty list of limits.
    assert (
        'asked for a ResourceClaim for 1 gpu.nvidia.com device where device.capacity["gpu.nvidia.com"]'
        in message
    )
    assert 'quantity("200Gi")' in message
    # kube-scheduler's own sentence: no node can allocate the claim, and preempting would not
    # help (1.34 puts its DRA plugin's "still not schedulable" between the two).
    preemption = "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    assert message.endswith(preemption)
    first = "pending: 0/4 nodes are available: 4 cannot allocate all claims."
    assert any(state.startswith(first) and state.endswith(preemption) for state in states), states
    assert kernels.list_kernel_ids() == []
    await nothing_left(nvidia)


def cordon(cluster: KubeCluster, nodes: list[str], unschedulable: bool = True) -> None:
    """``kubectl cordon`` (or uncordon) the nodes."""
    for name in nodes:
        cluster.patch(NODES, name, {"spec": {"unschedulable": unschedulable}})


async def test_fallbacks_give_a_mig_device_else_an_mps_share_and_say_which(nvidia: KubeCluster) -> None:
    """firstAvailable is honoured per node: where the MIG node is the only one, two kernels get
    its 1g.10gb devices; once they are taken, the third falls back to an MPS share elsewhere.

    The order does not reach across nodes on 1.34: its kube-scheduler does not score nodes by
    which entry they satisfy (1.37's does), so with every node open the first kernels may well
    get MPS shares while MIG devices sit free (docs/dra.md, "Fallbacks"). Hence the cordon."""
    kernels = manager("nvidia-dra", dra_fallbacks=["mig", "mps", "exclusive"])
    others = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    cordon(nvidia, others)
    started = [await kernels.start_kernel(kernel_name="idle-6g-mig") for _ in range(2)]
    cordon(nvidia, others, unschedulable=False)
    started.append(await kernels.start_kernel(kernel_name="idle-6g-mig"))
    try:
        backend = kubernetes_backend(GPUShare(backend="kubernetes", resource_preset="nvidia-dra"))
        views = {view["kernel_id"]: view for view in backend.all_kernels()}
        # Two 1g.10gb devices on the MIG node, then the claim falls back to an MPS share.
        assert [views[kernel_id]["mode"] for kernel_id in started] == ["mig", "mig", "mps"]
        third = kernels.get_kernel(started[2]).provisioner
        assert third.state.endswith("the claim got mps")
        # The pool from ResourceSlices and claims: the MIG devices in use, memory reserved.
        pool = backend.pool()
        by_node = {device["node"]: device for device in pool["devices"]}
        assert set(by_node) == {f"gpu-node-{index}" for index in range(1, 5)}
        mig = by_node["gpu-node-4"]
        assert mig["modes"] == ["mig"] and mig["memory_total"] == 60 * GiB
        assert sorted((item["profile"], item["in_use"]) for item in mig["mig"]) == [
            ("1g.10gb", True),
            ("1g.10gb", True),
            ("3g.40gb", False),
        ]
        assert {item["kernel_id"] for item in mig["mig"] if item["in_use"]} == set(started[:2])
        assert mig["memory_reserved"] == 20 * GiB
        mps_node = views[started[2]]["node"]
        assert by_node[mps_node]["memory_reserved"] == 80 * GiB  # a claim without shares holds its card
        assert by_node[mps_node]["modes"] == ["exclusive", "mps", "timeslice"]
    finally:
        await kernels.shutdown_all()
    await nothing_left(nvidia)


async def test_twenty_concurrent_starts_never_over_consume_capacity(hami: KubeCluster) -> None:
    """Four 80 GiB cards, twenty 24 GiB kernels at once: three per card start, the others fail
    with the scheduler's reason, and at no moment do the claims hold more than a card has."""
    slices = hami.objects(RESOURCE_SLICES)
    worst: dict[tuple[str, str], int] = {}
    done = asyncio.Event()

    async def watch_consumption() -> None:
        while not done.is_set():  # no deadline: samples until the starts are done
            for key, (held, total) in consumed_per_device(claims(hami), slices).items():
                assert held <= total, f"{key} holds {held} of {total}"
                worst[key] = max(worst.get(key, 0), held)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_consumption())
    kernels = manager("hami-dra")
    outcomes = await asyncio.gather(
        *(kernels.start_kernel(kernel_name="idle-24g-vgpu") for _ in range(20)), return_exceptions=True
    )
    try:
        started = [outcome for outcome in outcomes if isinstance(outcome, str)]
        refused = [outcome for outcome in outcomes if isinstance(outcome, DoesNotFitError)]
        assert len(started) == 12 and len(refused) == 8, outcomes
        assert all("cannot allocate all claims" in str(error) for error in refused)
        allocated = [claim for claim in claims(hami) if claim.get("status", {}).get("allocation")]
        assert len(allocated) == 12
        for claim in allocated:
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert result["consumedCapacity"] == {"memory": "24Gi", "cores": "25"}
        assert set(consumed_per_device(allocated, slices).values()) == {(72 * GiB, 80 * GiB)}
        pool = kubernetes_backend(GPUShare(backend="kubernetes", resource_preset="hami-dra")).pool()
        assert [(device["memory_reserved"], device["memory_total"]) for device in pool["devices"]] == [
            (72 * GiB, 80 * GiB)
        ] * 4
        assert all("vgpu" in device["modes"] for device in pool["devices"])
    finally:
        done.set()
        await watcher
        await kernels.shutdown_all()
    assert max(worst.values()) == 72 * GiB
    await nothing_left(hami)


async def test_a_single_user_server_gets_a_claim_created_with_its_pod_and_gone_with_it(
    spawner_cluster: KubeCluster,
) -> None:
    """KubeSpawner's hooks from gpu_profiles(preset="hami-dra"), as the hub: the server pod refers
    to its claim, the claim is created once the pod exists (replacing a stale one of the same
    name), owned by the pod; the scheduler allocates it; the garbage collector deletes it with
    the pod."""
    from kubernetes_asyncio.client import CoreV1Api
    from kubespawner import KubeSpawner

    from jupyter_gpushare.hub import gpu_profiles

    profiles = gpu_profiles(["4G"], "vgpu", preset="hami-dra", cores=20)
    config = Config(
        {
            "KubeSpawner": {
                "profile_list": profiles,
                "namespace": HUB_NAMESPACE,
                "cmd": ["python", "-c", "import time; time.sleep(600)"],
                "image": IMAGE,
            }
        }
    )
    async with await hub_client(spawner_cluster) as client:
        spawner = KubeSpawner(config=config, _mock=True)
        spawner.api = CoreV1Api(client)  # KubeSpawner's client, as the hub
        spawner.user_options = {"profile": "gpu", "gpu": "4g"}
        await spawner.load_user_options()
        manifest = await spawner.modify_pod_hook(spawner, await spawner.get_pod_manifest())
        stale = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"{spawner.pod_name}-gpu", "namespace": HUB_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "nothing"}}]}},
        }
        spawner_cluster.add(RESOURCE_CLAIMS, stale)
        created = await spawner.api.create_namespaced_pod(HUB_NAMESPACE, manifest)
        pod = client.sanitize_for_serialization(created)
        await spawner.after_pod_created_hook(spawner, pod)

    def running() -> bool:
        return [
            (p["status"].get("phase"), p["metadata"]["uid"])
            for p in spawner_cluster.objects(PODS, HUB_NAMESPACE)
        ] == [("Running", pod["metadata"]["uid"])]

    await eventually(running, what="the server pod running")
    [claim] = spawner_cluster.objects(RESOURCE_CLAIMS, HUB_NAMESPACE)
    assert claim["metadata"]["name"] == f"{spawner.pod_name}-gpu"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "20"}
    spawner_cluster.remove(PODS, HUB_NAMESPACE, pod["metadata"]["name"])
    await eventually(
        lambda: spawner_cluster.objects(RESOURCE_CLAIMS, HUB_NAMESPACE) == [],
        what="the claim gone with its pod",
    )


async def test_a_yaml_profile_server_gets_its_claim_from_a_template(
    spawner_cluster: KubeCluster,
) -> None:
    """static_profiles (Zero to JupyterHub YAML) refer the server pod to a ResourceClaimTemplate:
    Kubernetes' resourceclaim controller makes the pod's claim from it, owned by the pod; the
    scheduler allocates it; the garbage collector deletes it with the pod."""
    from kubernetes_asyncio.client import CoreV1Api
    from kubespawner import KubeSpawner

    from jupyter_gpushare.hub import claim_templates, static_profiles

    for template in claim_templates(["4G"], "vgpu", preset="hami-dra", cores=20, namespace=HUB_NAMESPACE):
        spawner_cluster.add(RESOURCE_CLAIM_TEMPLATES, template)
    profiles = static_profiles(["4G"], "vgpu", preset="hami-dra", cores=20)
    config = Config(
        {
            "KubeSpawner": {
                "profile_list": profiles,
                "namespace": HUB_NAMESPACE,
                "cmd": ["python", "-c", "import time; time.sleep(600)"],
                "image": IMAGE,
            }
        }
    )
    async with await hub_client(spawner_cluster) as client:
        spawner = KubeSpawner(config=config, _mock=True)
        spawner.user_options = {"profile": "gpu", "gpu": "4g"}
        await spawner.load_user_options()
        created = await CoreV1Api(client).create_namespaced_pod(
            HUB_NAMESPACE, await spawner.get_pod_manifest()
        )
        uid = created.metadata.uid

    await eventually(
        lambda: (
            [p["status"].get("phase") for p in spawner_cluster.objects(PODS, HUB_NAMESPACE)] == ["Running"]
        ),
        what="the server pod running",
    )
    [claim] = spawner_cluster.objects(RESOURCE_CLAIMS, HUB_NAMESPACE)
    [pod] = spawner_cluster.objects(PODS, HUB_NAMESPACE)
    assert pod["status"]["resourceClaimStatuses"] == [
        {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}
    ]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == uid
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "20"}
    spawner_cluster.remove(PODS, HUB_NAMESPACE, pod["metadata"]["name"])
    await eventually(
        lambda: spawner_cluster.objects(RESOURCE_CLAIMS, HUB_NAMESPACE) == [],
        what="the claim gone with its pod",
    )
