"""``jupyter gpushare doctor`` on this machine: no GPU, no cluster — said truthfully, with fixes,
and only the lines that matter where the user is (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.doctor import check_modes, check_vgpu, node_facts, relevant_mode_checks
from jupyter_gpushare.backends.local.inventory import discover, parse_simulation
from jupyter_gpushare.cli import main
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.findings import PoolSeen, check_gpus
from jupyter_gpushare.doctor import run_checks
from jupyter_gpushare.doctor.kernel import kernel_verdict


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("JUPYTER_GPUSHARE_SIMULATE", raising=False)


def test_no_gpu_fails_with_fixes_and_a_nonzero_exit_and_no_word_of_a_cluster(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["doctor", "--json"]) == 1
    found = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert found["GPUs"]["status"] == "FAIL" and "no GPU found" in found["GPUs"]["detail"]
    assert "JUPYTER_GPUSHARE_SIMULATE" in found["GPUs"]["fix"]
    assert found["test kernel"]["status"] == "FAIL"
    assert found["ledger"]["status"] == "OK"
    # A local box: nothing about a cluster, MIG, MPS or HAMi-core it never asked for.
    assert not {"cluster", "MIG", "MPS", "HAMi-core", "modes"} & found.keys()
    assert all(check["fix"] for check in found.values() if check["status"] != "OK")


def test_kubernetes_backend_without_a_cluster_is_a_failure(no_cluster: None, tmp_path: Path) -> None:
    settings = GPUShare(backend="kubernetes", simulate="1xT4-16GB", ledger_path=str(tmp_path / "l.sqlite"))
    checks = {check.name: check for check in run_checks(settings, kernel=False)}
    assert checks["cluster"].status == "FAIL"
    assert not {"GPUs", "ledger", "MIG", "MPS", "HAMi-core"} & checks.keys()  # the server's machine


def test_a_simulated_pool_starts_a_real_test_kernel(
    no_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "1xA100-80GB")
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "WARN  GPUs: simulated pool (GPU0 Simulated A100-80GB)" in text
    assert "OK    modes: exclusive, mps, timeslice, vgpu (default timeslice); not set up here: mig" in text
    assert "OK    test kernel: CUDA_VISIBLE_DEVICES=GPU-" in text and "slice 512 MiB" in text
    assert "MIG:" not in text and "MPS:" not in text and "HAMi-core:" not in text
    assert " 0 FAIL, " in text.strip().splitlines()[-1]


def test_the_pool_a_demo_left_in_the_ledger_is_the_pool_and_its_kernels_start(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``make demo`` (the lab had JUPYTER_GPUSHARE_SIMULATE, this terminal has not),
    ``status`` shows the simulated pool the ledger remembers. Failed before: doctor said "no GPU"
    and did not start its kernel."""
    from jupyter_gpushare.backends.local import LocalBackend

    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(ledger))
    LocalBackend(GPUShare(simulate="2xA100-80GB", ledger_path=str(ledger))).ledger.close()
    checks = {check.name: check for check in run_checks(GPUShare(), kernel=True)}
    assert checks["GPUs"].status == "WARN"
    assert checks["GPUs"].detail.startswith(
        "simulated pool remembered by the ledger (GPU0 Simulated A100-80GB"
    )
    assert checks["modes"].status == "OK"
    assert checks["test kernel"].status == "OK", checks["test kernel"]


def test_a_default_mode_the_node_cannot_honour_fails_with_the_way_out(tmp_path: Path) -> None:
    inventory = parse_simulation("1xA100-80GB")
    real = PoolSeen(("GPU0 A100",), False, "NVML")
    settings = GPUShare(default_mode="mps", ledger_path=str(tmp_path / "l.sqlite"))
    # A real (not simulated) card without an MPS daemon.
    from dataclasses import replace

    facts = replace(node_facts(settings, inventory, real), simulated=False)
    modes = check_modes(settings, facts)
    assert modes.status == "FAIL" and "the default mode 'mps' is not available here" in modes.detail
    assert "c.GPUShare.default_mode" in modes.fix
    # Now that MPS is the default, its line says what is missing.
    assert [check.name for check in relevant_mode_checks(settings, inventory, facts)] == ["MPS"]


def test_the_mode_lines_appear_where_configured() -> None:
    inventory = discover("")  # no GPU here
    settings = GPUShare(libvgpu_path="/nonexistent/libvgpu.so")
    facts = node_facts(settings, inventory, PoolSeen((), False, "NVML"))
    [vgpu] = relevant_mode_checks(settings, inventory, facts)
    assert vgpu.name == "HAMi-core" and vgpu.status == "FAIL" and "does not exist" in vgpu.detail
    assert check_vgpu(settings) == vgpu
    assert relevant_mode_checks(GPUShare(), inventory, facts) == []


def test_checks_say_what_they_found() -> None:
    assert check_gpus(PoolSeen(("GPU0 T4",), True, "simulated")).status == "WARN"
    served = check_gpus(PoolSeen(("GPU0 A100",), False, "the broker"))
    assert served.status == "OK" and served.detail == "served by the broker: GPU0 A100"


def test_with_a_broker_it_checks_the_broker_and_opens_no_ledger(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    settings = GPUShare(broker_url=f"unix:{tmp_path}/broker.sock")
    found = {check.name: check for check in run_checks(settings, kernel=False)}
    assert "ledger" not in found and "cluster" not in found and "GPUs" not in found
    assert found["broker"].status == "FAIL" and "is not reachable" in found["broker"].detail
    assert "jupyter gpushare broker" in found["broker"].fix
    assert not (tmp_path / "ledger.sqlite").exists()


def test_a_kernel_pods_devices_are_the_device_plugins_not_cuda_visible_devices() -> None:
    """In a pod, the device plugin (or CDI) names the devices in NVIDIA_VISIBLE_DEVICES and
    nothing sets CUDA_VISIBLE_DEVICES. Failed before: "the kernel got no slice" on every cluster."""
    seen = {
        "visible": "GPU-1",
        "visible_from": "NVIDIA_VISIBLE_DEVICES",
        "memory": str(2**29),
        "torch_cuda": None,
    }
    check = kernel_verdict(seen, simulated=False)
    assert (check.status, check.detail) == (
        "OK",
        "NVIDIA_VISIBLE_DEVICES=GPU-1, slice 512 MiB (PyTorch not installed: framework check skipped)",
    )
    assert kernel_verdict({**seen, "visible": None, "visible_from": None}, simulated=False).status == "FAIL"


def test_the_test_kernel_refers_only_to_checks_that_were_printed(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a broker that does not answer no GPUs line is printed. Failed before: the test
    kernel said "fix the GPUs check first"."""
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    checks = run_checks(GPUShare(broker_url=f"unix:{tmp_path}/broker.sock"), kernel=True)
    names = [check.name for check in checks]
    assert "GPUs" not in names
    test_kernel = checks[-1]
    assert (test_kernel.name, test_kernel.status) == ("test kernel", "FAIL")
    assert test_kernel.fix == "fix the broker check first", test_kernel
    # Without a GPU on a node the GPUs line is printed, and named.
    monkeypatch.delenv("JUPYTER_GPUSHARE_SIMULATE", raising=False)
    local = run_checks(GPUShare(ledger_path=str(tmp_path / "l.sqlite")), kernel=True)
    assert local[1].name == "GPUs" and local[-1].fix == "fix the GPUs check first"


def test_a_socket_nobody_listens_on_is_a_broker_that_is_not_running(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    path = tmp_path / "broker.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))  # as a broker killed with -9 leaves it: a file, nothing listening
    try:
        [broker] = run_checks(GPUShare(broker_url=f"unix:{path}"), kernel=False)[1:2]
    finally:
        left.close()
    assert broker.status == "FAIL"
    assert broker.fix.startswith(f"nothing listens on {path}: the broker is not running; start the broker")
