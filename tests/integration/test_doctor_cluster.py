"""``jupyter gpushare doctor`` with a simulated pool and the kmock cluster: each check says what
it found there, with the device plugins' resources and with a DRA driver's ResourceSlices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpushare.cli import main

from .conftest import Node
from .k8s_sim import SimulatedCluster, dra_nodes, hami_cluster, nvidia_cluster

pytestmark = pytest.mark.integration


def test_doctor_reports_the_simulated_cluster(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with SimulatedCluster(tmp_path / "cluster", "kernels") as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        monkeypatch.setenv("JUPYTER_GPUSHARE_BACKEND", "kubernetes")
        monkeypatch.setenv("JUPYTER_GPUSHARE_NAMESPACE", "kernels")
        exit_code = main(["doctor", "--json", "--no-kernel"])
    report = json.loads(capsys.readouterr().out)
    found = {check["name"]: check for check in report["checks"]}
    # The server's own machine has no GPU to check: the cluster's nodes are the pool.
    assert not {"GPUs", "ledger", "MIG", "MPS", "HAMi-core"} & found.keys()
    assert found["cluster"] == {"name": "cluster", "status": "OK", "detail": "4 node(s) reachable", "fix": ""}
    # The simulated nodes advertise HAMi's resources: 4 cards, 80 GiB each.
    resources = found["GPU resources"]
    assert resources["status"] == "OK"
    assert "nvidia.com/gpu=4" in resources["detail"] and "nvidia.com/gpumem=327680" in resources["detail"]
    # The emulator has no authorization API: doctor says RBAC cannot be confirmed, with the fix.
    assert found["RBAC"]["status"] == "FAIL" and "rbac.yaml" in found["RBAC"]["fix"]
    assert exit_code == 1


def doctor_on(
    cluster: SimulatedCluster,
    preset: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, dict[str, str]]:
    """``doctor --json`` against ``cluster`` with ``preset``: its checks by name."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("JUPYTER_GPUSHARE_BACKEND", "kubernetes")
    monkeypatch.setenv("JUPYTER_GPUSHARE_NAMESPACE", "kernels")
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", preset)
    main(["doctor", "--json", "--no-kernel"])
    return {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}


def test_doctor_reports_dra_facts_of_nvidias_driver(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DRA API version, the device classes, consumable capacity (off: NVIDIA's full GPUs as
    published by default take one claim each) and the devices in the ResourceSlices."""
    with SimulatedCluster(
        tmp_path / "cluster", "kernels", nodes=dra_nodes(), dra=nvidia_cluster()
    ) as cluster:
        found = doctor_on(cluster, "nvidia-dra", monkeypatch, capsys)
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
    # The emulator has no authorization API: the fix names the DRA Role too.
    assert "rbac-dra.yaml" in found["RBAC"]["fix"]


def test_doctor_reports_hamis_consumable_capacity(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with SimulatedCluster(tmp_path / "cluster", "kernels", nodes=dra_nodes(), dra=hami_cluster()) as cluster:
        found = doctor_on(cluster, "hami-dra", monkeypatch, capsys)
    assert found["consumable capacity"]["status"] == "OK"
    assert found["consumable capacity"]["detail"] == (
        "on: 4 of 4 hami-core-gpu.project-hami.io device(s) take several claims"
    )
    assert found["device classes"]["detail"] == "hami-core-gpu.project-hami.io"


def test_doctor_says_a_cluster_without_dra_cannot_serve_a_dra_preset(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with SimulatedCluster(tmp_path / "cluster", "kernels") as cluster:  # device plugins only
        found = doctor_on(cluster, "nvidia-dra", monkeypatch, capsys)
    assert found["DRA"]["status"] == "FAIL"
    assert found["DRA"]["detail"] == (
        "the cluster serves no resource.k8s.io API; preset 'nvidia-dra' needs resource.k8s.io/v1"
    )
    assert "Kubernetes 1.34" in found["DRA"]["fix"]
