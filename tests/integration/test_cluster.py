"""The test cluster itself (tests/cluster/): Kubernetes' own control plane with the simulated node
side, held to what a cluster does.

The Kubernetes backend's tests trust the node side to act as kubelets and DRA drivers do; these
tests check it against the real components: nodes registered as themselves and kept Ready
(Leases), the Node authorizer deciding what a node may read, bound pods run with their Secret
volumes and logs served through the API server, deletion and OOM as kubelet reports them,
identities minted for users and ServiceAccounts, and ``make cluster`` (tests/cluster/__main__.py)
running a DRA kernel pod rendered by ``jupyter gpushare render-pod``.
"""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from ..cluster import LEASES, NODES, PODS, RESOURCE_CLAIMS, SECRETS, Api, ApiError, KubeCluster
from ..cluster.rest import ROLE_BINDINGS, identity_from_kubeconfig
from ..support.kernels import has_ended
from ..support.nodes import BROKEN_IMAGE
from ..support.polling import wait_until
from .conftest import MakeKube

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parents[2]


def python_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A pod whose container runs ``code`` with this Python (the node side runs it here)."""
    container: dict[str, Any] = {"name": "main", "image": "python:3.11", "command": ["python", "-c", code]}
    if "mounts" in spec:
        container["volumeMounts"] = spec.pop("mounts")
    if "image" in spec:
        container["image"] = spec.pop("image")
    return {
        "metadata": {"name": name},
        "spec": {"containers": [container], "restartPolicy": "Never", **spec},
    }


def phase(kube: KubeCluster, name: str, wanted: str, timeout: float = 30) -> dict[str, Any]:
    return wait_until(
        lambda: kube.get(PODS, name),
        timeout,
        message=f"pod {name} {wanted}",
        until=lambda pod: pod is not None and pod["status"].get("phase") == wanted,
    )


SERVE = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)"


# ---- nodes ------------------------------------------------------------------------------------


def test_nodes_register_as_themselves_and_their_leases_keep_them_ready(make_kube: MakeKube) -> None:
    kube = make_kube(lease_renewal=0.5)  # kubelet renews every 10 s; a test need not wait that long
    nodes = {node["metadata"]["name"]: node for node in kube.objects(NODES)}
    assert sorted(nodes) == [f"gpu-node-{index}" for index in range(1, 5)]
    node = nodes["gpu-node-1"]
    assert node["status"]["allocatable"]["nvidia.com/gpumem"] == "81920"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    # The node-lifecycle controller found them healthy: no not-ready or unreachable taint.
    assert {name: node["spec"].get("taints") for name, node in nodes.items()} == dict.fromkeys(nodes)

    lease = kube.get(LEASES, "gpu-node-1", "kube-node-lease")
    assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-node-1"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    wait_until(
        lambda: kube.get(LEASES, "gpu-node-1", "kube-node-lease"),
        30,
        message="a renewed Lease",
        until=lambda renewed: renewed["spec"]["renewTime"] != lease["spec"]["renewTime"],
    )


def test_a_node_reads_only_the_secrets_of_pods_bound_to_it(kube: KubeCluster) -> None:
    """The real Node authorizer: the node side can mount a pod's Secret because the pod is bound
    to that node, and no other node can read it."""
    kube.add(SECRETS, {"metadata": {"name": "mounted"}, "stringData": {"token": "t"}})
    kube.add(
        PODS,
        python_pod(
            "mounter",
            SERVE,
            nodeSelector={"kubernetes.io/hostname": "gpu-node-2"},
            volumes=[{"name": "s", "secret": {"secretName": "mounted"}}],
            mounts=[{"name": "s", "mountPath": "/etc/s"}],
        ),
    )
    phase(kube, "mounter", "Running")
    plane = kube.control_plane
    for node, allowed in (("gpu-node-2", True), ("gpu-node-3", False)):
        api = Api(plane.certificate_identity(f"system:node:{node}", ["system:nodes"], f"reader-{node}"))
        try:
            if allowed:
                assert api.get(SECRETS, "mounted", kube.namespace) is not None
            else:
                with pytest.raises(ApiError) as refused:
                    api.get(SECRETS, "mounted", kube.namespace)
                assert refused.value.status == 403
                assert (
                    "no relationship found between node 'gpu-node-3' and this object" in refused.value.message
                )
        finally:
            api.close()


# ---- pods -------------------------------------------------------------------------------------

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


def test_a_bound_pod_runs_with_its_secret_volume_and_its_log_is_served_through_the_api(
    kube: KubeCluster,
) -> None:
    connection = json.dumps({"ip": "0.0.0.0", "shell_port": 50001})
    kube.add(
        SECRETS,
        {
            "metadata": {"name": "kernel-conn"},
            "stringData": {"token": "s3cret", "connection.json": connection},
        },
    )
    kube.add(
        PODS,
        python_pod(
            "reader",
            READ_THE_SECRET,
            volumes=[{"name": "conn", "secret": {"secretName": "kernel-conn", "defaultMode": 0o400}}],
            mounts=[{"name": "conn", "mountPath": "/etc/kernel", "readOnly": True}],
        ),
    )
    pod = phase(kube, "reader", "Succeeded")
    assert pod["spec"]["nodeName"].startswith("gpu-node-")
    [container] = pod["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 0
    assert container["state"]["terminated"]["reason"] == "Completed"
    seen = json.loads(kube.pod_log("reader"))
    assert seen["entries"] == ["..2025_01_01_00_00_00.000000000", "..data", "connection.json", "token"]
    assert seen["links"]["token"] == "..data/token" and seen["token"] == "s3cret" and seen["mode"] == 0o400
    # The one liberty: a kernel's connection file gets the pod's own loopback address.
    assert seen["ip"] == pod["status"]["podIP"] and seen["ip"].startswith("127.")
    # The scheduler posts through events.k8s.io (reportingController, no source), kubelet the old way.
    reasons = [(event["reason"], event.get("reportingComponent")) for event in kube.events("reader")]
    assert reasons == [
        ("Scheduled", "default-scheduler"),
        ("Pulled", "kubelet"),
        ("Created", "kubelet"),
        ("Started", "kubelet"),
    ]


def test_deleting_a_pod_stops_its_process_and_kubelet_removes_it(kube: KubeCluster) -> None:
    kube.add(PODS, python_pod("server", SERVE, terminationGracePeriodSeconds=30))
    phase(kube, "server", "Running")
    pid = int(wait_until(lambda: kube.pod_log("server").strip(), 30, message="the pod's pid"))
    assert psutil.Process(pid).is_running()
    kube.remove(PODS, kube.namespace, "server")  # graceful: marked, then gone once stopped
    wait_until(lambda: kube.get(PODS, "server") is None, 30, message="the pod gone")
    wait_until(lambda: has_ended(pid), 30, message="its process ended")
    assert kube.node.running == {}


def test_pods_bound_in_bursts_beyond_a_nodes_addresses_all_run_with_addresses_of_their_own(
    kube: KubeCluster,
) -> None:
    """A node side gives its pods addresses from one /24 (253 of them) as CNI's host-local IPAM
    does: a burst of pods bound at once all run, and so does the next burst once the first is
    gone, although the two together hold more pods than the /24 has addresses."""
    burst = 150

    def run_burst(tag: str) -> list[dict[str, Any]]:
        pods = [
            {
                "metadata": {"name": f"{tag}-{index:03d}"},
                "spec": {
                    "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "600"]}],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                },
            }
            for index in range(burst)
        ]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda pod: kube.add(PODS, pod), pods))
        wait_until(
            lambda: (
                sum(pod["status"].get("phase") == "Running" for pod in kube.pods()),
                kube.violations[:1],
            ),
            120,
            interval=0.5,
            message=f"the {burst} pods of {tag} running (running, the node side's first violation)",
            until=lambda seen: seen[0] == burst,
        )
        return kube.pods()

    for tag in ("first", "second"):
        running = run_burst(tag)
        addresses = [ipaddress.IPv4Address(pod["status"]["podIP"]) for pod in running]
        assert len(set(addresses)) == burst
        assert all(address.is_loopback for address in addresses)
        kube.clear()
        wait_until(lambda: not kube.pods() and not kube.node.running, 60, message=f"the pods of {tag} gone")
    assert kube.violations == []


def test_an_oom_kill_fails_the_pod_with_oomkilled(kube: KubeCluster) -> None:
    kube.add(PODS, python_pod("hungry", SERVE))
    phase(kube, "hungry", "Running")
    kube.call(lambda: kube.node.oom_kill("hungry"))
    pod = phase(kube, "hungry", "Failed")
    [container] = pod["status"]["containerStatuses"]
    assert (container["state"]["terminated"]["exitCode"], container["state"]["terminated"]["reason"]) == (
        137,
        "OOMKilled",
    )


def test_an_unknown_image_fails_to_pull_and_nothing_runs(kube: KubeCluster) -> None:
    kube.add(PODS, python_pod("broken", SERVE, image=BROKEN_IMAGE))
    not_found = (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{BROKEN_IMAGE}": not found'
    )
    pod = wait_until(
        lambda: kube.get(PODS, "broken"),
        30,
        message="ErrImagePull",
        until=lambda pod: (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("waiting"),
    )
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert (waiting["reason"], waiting["message"]) == ("ErrImagePull", not_found)
    assert pod["status"]["phase"] == "Pending" and pod["spec"]["nodeName"].startswith("gpu-node-")
    wait_until(
        lambda: kube.get(PODS, "broken"),
        30,
        message="ImagePullBackOff",
        until=lambda pod: (
            pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
        ),
    )
    assert kube.node.running == {}
    with pytest.raises(ApiError) as no_output:
        kube.pod_log("broken")
    assert no_output.value.status == 400


# ---- identities ---------------------------------------------------------------------------------


def test_a_user_in_a_group_is_allowed_what_a_binding_for_the_group_grants(kube: KubeCluster) -> None:
    kubeconfig = kube.kubeconfig_for_user("carol", ["team-a"])
    api = kube.api_as(kubeconfig)
    try:
        with pytest.raises(ApiError) as refused:
            api.list(PODS, kube.namespace)
        assert (
            refused.value.status == 403
            and 'User "carol" cannot list resource "pods"' in refused.value.message
        )
        kube.add(
            ROLE_BINDINGS,
            {
                "metadata": {"name": "team-a-views"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}],
            },
        )
        wait_until(lambda: _can_list(api, kube.namespace), 30, message="the binding in force")
    finally:
        api.close()
        kube.admin.delete(ROLE_BINDINGS, "team-a-views", kube.namespace)


def _can_list(api: Api, namespace: str) -> bool:
    try:
        api.list(PODS, namespace)
    except ApiError:
        return False
    return True


# ---- make cluster -------------------------------------------------------------------------------


def test_make_cluster_runs_a_dra_kernel_pod_from_render_pod_and_its_claim_goes_with_it(
    tmp_path: Path,
) -> None:
    """The Done-when of issue 21: ``make cluster`` (python -m tests.cluster) comes up with four
    nodes and NVIDIA's DRA driver; a kernel pod and its claim rendered by ``jupyter gpushare
    render-pod --preset nvidia-dra`` are created there; kube-scheduler allocates the claim and
    binds the pod to a simulated node, which runs it; deleting the pod deletes the claim (the
    garbage collector); SIGTERM stops everything."""
    directory = tmp_path / "make-cluster"
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster", f"--directory={directory}"],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    kubeconfig = directory / "kubeconfig"
    try:
        wait_until(lambda: kubeconfig.exists() or process.poll() is not None, 240, 0.2, "make cluster up")
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        print(f"make cluster: up after {time.monotonic() - started:.1f} s")  # the figure docs quote
        api = Api(identity_from_kubeconfig(kubeconfig, tmp_path / "admin"))
        try:
            run_rendered_kernel(api)
        finally:
            api.close()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "The cluster is up" in output and f"export KUBECONFIG={kubeconfig}" in output
    assert not kubeconfig.exists()
    # Nothing of it left running: the control plane, the kernel's process.
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if str(directory) in " ".join(p.info["cmdline"] or [])
    ]


def run_rendered_kernel(api: Api) -> None:
    """A kernel pod and its claim as render-pod prints them, created as the provisioner creates
    them (the Secret, the pod, then the claim owned by the pod); its kernel process replaced by a
    sleeper (the connection file here is no real kernel's)."""
    jupyter = Path(sys.executable).parent / "jupyter"
    command = [
        str(jupyter),
        "gpushare",
        "render-pod",
        "--preset",
        "nvidia-dra",
        "--memory",
        "6G",
        "--mode",
        "mps",
    ]
    rendered = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    by_kind = {manifest["kind"]: manifest for manifest in yaml.safe_load_all(rendered) if manifest}
    pod, claim = by_kind["Pod"], by_kind["ResourceClaim"]
    namespace = pod["metadata"]["namespace"]
    [secret_volume] = [volume for volume in pod["spec"]["volumes"] if "secret" in volume]
    secret = {"metadata": {"name": secret_volume["secret"]["secretName"], "namespace": namespace}}
    api.create(
        SECRETS, {**secret, "stringData": {"connection.json": json.dumps({"ip": "0.0.0.0"}), "token": "t"}}
    )
    pod["spec"]["containers"][0]["command"] = ["python", "-c", SERVE]
    pod["spec"]["containers"][0].pop("args", None)
    created = api.create(PODS, pod)
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": created["metadata"]["name"],
        "uid": created["metadata"]["uid"],
    }
    claim["metadata"]["ownerReferences"] = [{**owner, "blockOwnerDeletion": True, "controller": True}]
    api.create(RESOURCE_CLAIMS, claim)
    name = created["metadata"]["name"]
    running = wait_until(
        lambda: api.get(PODS, name, namespace),
        60,
        message="the kernel pod running",
        until=lambda pod: pod["status"].get("phase") == "Running",
    )
    assert running["spec"]["nodeName"].startswith("gpu-node-")
    allocated = api.get(RESOURCE_CLAIMS, claim["metadata"]["name"], namespace)
    assert allocated is not None
    [result] = allocated["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == "gpu.nvidia.com" and result["pool"] == running["spec"]["nodeName"]
    assert allocated["status"]["reservedFor"][0]["uid"] == running["metadata"]["uid"]
    api.delete(PODS, name, namespace)
    wait_until(
        lambda: api.get(RESOURCE_CLAIMS, claim["metadata"]["name"], namespace) is None,
        60,
        message="the claim gone with its pod (the garbage collector)",
    )
