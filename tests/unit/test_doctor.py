"""``jupyter gpushare doctor`` on this machine: no GPU, no cluster — said truthfully, with fixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpushare.cli import main
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.doctor import check_gpus, check_vgpu, run_checks
from jupyter_gpushare.inventory import parse_simulation


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_no_gpu_and_no_cluster_fail_with_fixes_and_a_nonzero_exit(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["doctor", "--json"]) == 1
    found = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert found["GPUs"]["status"] == "FAIL" and "no GPU found" in found["GPUs"]["detail"]
    assert "JUPYTER_GPUSHARE_SIMULATE" in found["GPUs"]["fix"]
    assert found["cluster"]["status"] == "WARN" and "kubeconfig" in found["cluster"]["fix"]
    assert found["test kernel"]["status"] == "FAIL"
    assert found["ledger"]["status"] == "OK"
    assert all(check["fix"] for check in found.values() if check["status"] != "OK")


def test_kubernetes_backend_without_a_cluster_is_a_failure(no_cluster: None, tmp_path: Path) -> None:
    settings = GPUShare(backend="kubernetes", simulate="1xT4-16GB", ledger_path=str(tmp_path / "l.sqlite"))
    checks = {check.name: check for check in run_checks(settings, kernel=False)}
    assert checks["cluster"].status == "FAIL"


def test_a_simulated_pool_starts_a_real_test_kernel(
    no_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "1xA100-80GB")
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["doctor"]) == 0  # warnings only
    text = capsys.readouterr().out
    assert "WARN  GPUs: simulated pool (Simulated A100-80GB)" in text
    assert "WARN  test kernel: CUDA_VISIBLE_DEVICES=GPU-" in text and "slice 512 MiB" in text
    assert text.strip().endswith("0 FAIL, 7 WARN")


def test_checks_say_what_they_found() -> None:
    assert check_gpus(parse_simulation("2xT4-16GB")).status == "WARN"
    missing = check_vgpu(GPUShare(libvgpu_path="/nonexistent/libvgpu.so"))
    assert missing.status == "FAIL" and "does not exist" in missing.detail


def test_with_a_broker_it_checks_the_broker_and_opens_no_ledger(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    settings = GPUShare(broker_url=f"unix:{tmp_path}/broker.sock")
    found = {check.name: check for check in run_checks(settings, kernel=False)}
    assert "ledger" not in found and "cluster" not in found
    assert found["broker"].status == "FAIL" and "is not reachable" in found["broker"].detail
    assert "jupyter gpushare broker" in found["broker"].fix
    assert not (tmp_path / "ledger.sqlite").exists()
