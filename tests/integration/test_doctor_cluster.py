"""``jupyter gpushare doctor`` on Kubernetes' own control plane (tests/cluster/): each check says
what it found there, with the device plugins' resources and with a DRA driver's ResourceSlices,
and the RBAC check is the real authorizer's answer for the identity doctor runs as.

(A cluster that serves no ``resource.k8s.io`` API at all is older than any Kubernetes this control
plane builds: tests/unit/backends/kubernetes/test_doctor_old_cluster.py gives doctor that one canned
answer.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpushare.backends.kubernetes.cluster.clients import forget_shared_clusters
from jupyter_gpushare.cli import main

from ..cluster import KubeCluster, dra_nodes, hami_driver, nvidia_driver
from ..cluster.rest import CLUSTER_ROLE_BINDINGS
from .conftest import MakeKube

pytestmark = pytest.mark.integration

NODE_READER = "jupyter-gpushare-nodes"  # the shipped ClusterRole (rbac.yaml): nodes list, watch


def doctor(
    kubeconfig: Path,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    preset: str | None = None,
    kueue_queue: str | None = None,
) -> tuple[int, dict[str, dict[str, str]]]:
    """``doctor --json --no-kernel`` as the identity of ``kubeconfig``: its exit code, its checks by name."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("JUPYTER_GPUSHARE_BACKEND", "kubernetes")
    monkeypatch.setenv("JUPYTER_GPUSHARE_NAMESPACE", namespace)
    if preset is not None:
        monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", preset)
    if kueue_queue is not None:
        monkeypatch.setenv("JUPYTER_GPUSHARE_KUEUE_QUEUE", kueue_queue)
    forget_shared_clusters()  # the client is shared per process: this one acts as this identity
    exit_code = main(["doctor", "--json", "--no-kernel"])
    forget_shared_clusters()
    report = json.loads(capsys.readouterr().out)
    return exit_code, {check["name"]: check for check in report["checks"]}


def test_doctor_reports_the_cluster_as_the_servers_service_account(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys)
    # The server's own machine has no GPU to check: the cluster's nodes are the pool.
    assert not {"GPUs", "ledger", "MIG", "MPS", "HAMi-core"} & found.keys()
    assert found["cluster"] == {"name": "cluster", "status": "OK", "detail": "4 node(s) reachable", "fix": ""}
    # The simulated nodes advertise HAMi's resources: 4 cards, 80 GiB each.
    resources = found["GPU resources"]
    assert resources["status"] == "OK"
    assert "nvidia.com/gpu=40" in resources["detail"] and "nvidia.com/gpumem=327680" in resources["detail"]
    # The shipped rbac.yaml, applied as its comments say: the real authorizer allows it all.
    assert found["RBAC"] == {
        "name": "RBAC",
        "status": "OK",
        "detail": f"may create and delete kernel pods and Secrets in {kube.namespace}",
        "fix": "",
    }
    assert exit_code == 0, found


def test_doctor_says_what_an_identity_without_the_role_may_not_do(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user the shipped RBAC binds nothing to: the authorizer refuses node listing first."""
    stranger = kube.kubeconfig_for_user("mallory", ["team-b"])
    exit_code, found = doctor(stranger, kube.namespace, monkeypatch, capsys)
    assert found["cluster"]["status"] == "FAIL"
    assert found["cluster"]["detail"].startswith("cannot list nodes: ")
    assert "rbac.yaml" in found["cluster"]["fix"]
    assert exit_code == 1


def test_doctor_names_each_verb_the_role_does_not_grant(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An identity that may list nodes (the shipped ClusterRole) but has no Role in the
    kernels' namespace: the RBAC check lists what the real authorizer refuses, with the fix."""
    reader = kube.kubeconfig_for_user("node-reader", ["team-b"])
    kube.admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{kube.namespace}-node-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NODE_READER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "node-reader"}],
        }
    )
    try:
        exit_code, found = doctor(reader, kube.namespace, monkeypatch, capsys)
    finally:
        kube.admin.delete(CLUSTER_ROLE_BINDINGS, f"{kube.namespace}-node-reader")
    assert found["cluster"]["status"] == "OK"
    assert found["RBAC"]["status"] == "FAIL"
    assert found["RBAC"]["detail"] == (
        f"not allowed in namespace {kube.namespace}: create pods, delete pods, watch pods, "
        "create secrets, list events"
    )
    assert found["RBAC"]["fix"] == "apply examples/kubernetes/rbac.yaml to the server's service account"
    assert exit_code == 1


def test_doctor_reports_dra_facts_of_nvidias_driver(
    make_kube: MakeKube, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DRA API version, the device classes, consumable capacity (off: NVIDIA's full GPUs as
    published by default take one claim each) and the devices in the ResourceSlices."""
    kube = make_kube(dra_nodes(), driver=nvidia_driver())
    _, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys, "nvidia-dra")
    assert found["DRA"]["status"] == "OK" and found["DRA"]["detail"].startswith("resource.k8s.io/v1 ")
    assert found["device classes"] == {
        "name": "device classes",
        "status": "OK",
        "detail": "gpu.nvidia.com, mig.nvidia.com",
        "fix": "",
    }
    assert found["consumable capacity"]["status"] == "WARN"
    assert found["consumable capacity"]["detail"].startswith("off: each of the 6 gpu.nvidia.com device(s)")
    assert found["GPU devices"]["detail"] == "3 GPU(s) and 3 MIG device(s) of gpu.nvidia.com on 4 node(s)"
    assert "GPU resources" not in found  # the device plugins' extended resources do not apply
    # rbac.yaml and rbac-dra.yaml as shipped: ResourceClaims too.
    assert found["RBAC"]["detail"] == (
        f"may create and delete kernel pods, Secrets and ResourceClaims in {kube.namespace}"
    )


def test_doctor_reports_hamis_consumable_capacity(
    make_kube: MakeKube, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = make_kube(dra_nodes(), driver=hami_driver())
    _, found = doctor(kube.kubeconfig, kube.namespace, monkeypatch, capsys, "hami-dra")
    assert found["consumable capacity"]["status"] == "OK"
    assert found["consumable capacity"]["detail"] == (
        "on: 4 of 4 hami-core-gpu.project-hami.io device(s) take several claims"
    )
    assert found["device classes"]["detail"] == "hami-core-gpu.project-hami.io"
