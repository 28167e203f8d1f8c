"""``jupyter gpushare doctor`` with a simulated pool and the kmock cluster: each check says what
it found there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpushare.cli import main

from .conftest import Node
from .k8s_sim import SimulatedCluster

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
    assert found["GPUs"]["status"] == "WARN" and "simulated pool" in found["GPUs"]["detail"]
    assert found["cluster"] == {"name": "cluster", "status": "OK", "detail": "4 node(s) reachable", "fix": ""}
    # The simulated nodes advertise HAMi's resources: 4 cards, 80 GiB each.
    resources = found["GPU resources"]
    assert resources["status"] == "OK"
    assert "nvidia.com/gpu=4" in resources["detail"] and "nvidia.com/gpumem=327680" in resources["detail"]
    # The emulator has no authorization API: doctor says RBAC cannot be confirmed, with the fix.
    assert found["RBAC"]["status"] == "FAIL" and "rbac.yaml" in found["RBAC"]["fix"]
    assert exit_code == 1
