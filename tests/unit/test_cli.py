"""``jupyter gpushare`` (docs/reference/cli.md), called in-process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import current_process, identify
from jupyter_gpushare.cli import main
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed, ProcessIdentity
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS

GiB = 2**30
SIMULATE = "2xA100-80GB,1xT4-16GB"
POOL_KEYS = {"backend", "simulated", "overcommit", "devices", "queue"}
DEVICE_KEYS = {
    "id",
    "uuid",
    "name",
    "memory_total",
    "memory_reserved",
    "memory_used",
    "utilization",
    "modes",
    "mig",
}
KERNEL_KEYS = {
    "kernel_id", "kernel_name", "path", "owner", "state", "queue_position", "device", "mode",
    "memory_request", "memory_used", "utilization", "warnings",
}  # fmt: skip


@pytest.fixture
def ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", SIMULATE)
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(path))
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
    return path


def hold(path: Path, kernel_id: str, owner: str, size: str, holder: ProcessIdentity) -> None:
    ledger = Ledger(path)
    ledger.register_devices(parse_simulation(SIMULATE).devices, simulated=True)
    ledger.enqueue(
        NewRequest(kernel_id, owner, "srv", "timeslice", "shared", size, None, holder, path="nb.ipynb")
    )
    assert isinstance(ledger.try_place(kernel_id, Policy()), Placed)
    ledger.close()


def status_json(capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["status", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_status_json_shape(ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = status_json(capsys)
    assert set(document) == {"pool", "kernels"}
    pool = document["pool"]
    assert set(pool) >= POOL_KEYS
    assert pool["simulated"] is True
    assert pool["backend"] == "local"
    assert [device["id"] for device in pool["devices"]] == [0, 1, 2]
    assert [device["memory_total"] for device in pool["devices"]] == [80 * GiB, 80 * GiB, 16 * GiB]
    for device in pool["devices"]:
        assert set(device) >= DEVICE_KEYS
        assert device["memory_reserved"] == 0
    assert pool["queue"] == []
    assert document["kernels"] == []
    assert ledger_path.exists()


def test_status_json_lists_kernels_of_all_servers_anonymising_others(
    ledger_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hold(ledger_path, "mine", "alice", "4G", current_process())
    hold(ledger_path, "theirs", "bob", "10G", current_process())
    document = status_json(capsys)
    kernels = document["kernels"]
    assert len(kernels) == 2
    for kernel in kernels:
        assert set(kernel) >= KERNEL_KEYS
        assert kernel["state"] == "running"
    by_owner = {kernel["owner"]: kernel for kernel in kernels}
    assert by_owner["alice"]["kernel_id"] == "mine"
    assert by_owner["alice"]["memory_request"] == 4 * GiB
    assert by_owner["another user"]["kernel_id"] is None
    assert by_owner["another user"]["memory_request"] == 10 * GiB
    reserved = sum(device["memory_reserved"] for device in document["pool"]["devices"])
    assert reserved == 14 * GiB


def test_status_reconciles_first(ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = subprocess.Popen(["sleep", "30"])
    identity = identify(kernel.pid)
    assert identity is not None
    hold(ledger_path, "crashed", "alice", "8G", identity)
    hold(ledger_path, "alive", "alice", "4G", current_process())
    kernel.kill()
    kernel.wait()
    document = status_json(capsys)
    assert [kernel["kernel_id"] for kernel in document["kernels"]] == ["alive"]
    assert sum(device["memory_reserved"] for device in document["pool"]["devices"]) == 4 * GiB
    assert [record.kernel_id for record in Ledger(ledger_path).records()] == ["alive"]


def test_status_text(ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hold(ledger_path, "mine", "alice", "10G", current_process())
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "simulated" in out
    assert str(ledger_path) in out
    gpu_lines = [line for line in out.splitlines() if line.startswith("GPU")]
    assert len(gpu_lines) == 3
    assert "T4" in gpu_lines[2]
    assert "mine" in out and "10G" in out


def test_status_text_shows_control_characters_as_escapes(
    ledger_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Written straight into a shared ledger (the broker refuses such ids): root reads the table.
    hold(ledger_path, "esc\x1b]0;owned\x07\x1b[2J\u202eevil", "alice", "4G", current_process())
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, out
    assert "esc\\x1b]0;owned\\x07\\x1b[2J\\u202eevil" in out


def test_status_without_any_gpu_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["status"]) == 0
    assert "no GPU found" in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["pool"]["devices"] == []
    assert document["pool"]["simulated"] is False


def test_status_with_an_unreadable_simulation_fails_clearly(ledger_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "lots of GPUs")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "lots of GPUs" in err
    assert "2xA100-80GB" in err  # an example to copy


def installed_specs(prefix: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in prefix.rglob("kernel.json")}


def test_kernelspec_install_with_a_bad_size_writes_nothing(tmp_path: Path, capsys) -> None:
    prefix = tmp_path / "prefix"
    assert main(["kernelspec", "install", "--sizes", "2G,abc", "--prefix", str(prefix)]) == 2
    err = capsys.readouterr().err
    assert ACCEPTED_FORMS in err
    assert "abc" in err
    assert installed_specs(tmp_path) == {}


@pytest.mark.parametrize("sizes", ["2G,,4G", ","])
def test_kernelspec_install_with_an_empty_size_writes_nothing(tmp_path: Path, capsys, sizes: str) -> None:
    assert main(["kernelspec", "install", "--sizes", sizes, "--prefix", str(tmp_path)]) == 2
    assert capsys.readouterr().err
    assert installed_specs(tmp_path) == {}


def test_kernelspec_install_two_sizes(tmp_path: Path, capsys) -> None:
    assert main(["kernelspec", "install", "--sizes", "2G, 4G", "--prefix", str(tmp_path)]) == 0
    specs = installed_specs(tmp_path)
    assert set(specs) == {"python3-gpu", "python3-gpu-2g", "python3-gpu-4g"}
    assert specs["python3-gpu"]["metadata"]["kernel_provisioner"]["config"]["gpu_memory"] is None
    for name, size in (("python3-gpu-2g", "2G"), ("python3-gpu-4g", "4G")):
        provisioner = specs[name]["metadata"]["kernel_provisioner"]
        assert provisioner["provisioner_name"] == "gpushare-provisioner"
        assert provisioner["config"]["gpu_memory"] == size
        assert provisioner["config"]["gpu_mode"] == "timeslice"
    out = capsys.readouterr().out
    assert "python3-gpu-2g" in out and "python3-gpu-4g" in out


def test_kernelspec_install_with_a_mode(tmp_path: Path) -> None:
    assert main(["kernelspec", "install", "--sizes", "8G", "--mode", "vgpu", "--prefix", str(tmp_path)]) == 0
    specs = installed_specs(tmp_path)
    assert set(specs) == {"python3-gpu-vgpu", "python3-gpu-8g-vgpu"}
    assert {spec["metadata"]["kernel_provisioner"]["config"]["gpu_mode"] for spec in specs.values()} == {
        "vgpu"
    }


def test_kernelspec_install_defaults_to_the_one_that_asks_in_the_configured_mode(tmp_path: Path) -> None:
    config_dir = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(
        json.dumps({"GPUShare": {"sizes": ["1G", "25%"], "default_mode": "mps"}})
    )
    assert main(["kernelspec", "install", "--prefix", str(tmp_path)]) == 0
    specs = installed_specs(tmp_path)
    assert list(specs) == ["python3-gpu-mps"]  # one launcher card; its size is picked at start
    spec = specs["python3-gpu-mps"]
    assert spec["display_name"] == "Python 3 (GPU, mps)"
    assert spec["metadata"]["kernel_provisioner"]["config"] == {
        "gpu_memory": None,
        "gpu_mode": "mps",
        "gpu_cores": None,
    }


def test_kernelspec_install_for_the_user_goes_to_the_jupyter_data_dir() -> None:
    assert main(["kernelspec", "install", "--sizes", "2G", "--user"]) == 0
    data_dir = Path(os.environ["JUPYTER_DATA_DIR"])
    assert (data_dir / "kernels" / "python3-gpu-2g" / "kernel.json").is_file()


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        [],
        ["kernelspec"],
        ["kernelspec", "remove"],
        ["kernelspec", "install", "--mode", "bogus"],
        ["kernelspec", "install", "--user", "--prefix", "/tmp/x"],
        ["status", "--yaml"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_broker_needs_somewhere_to_listen_and_no_broker_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "1xT4-16GB")
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "ledger.sqlite"))
    assert main(["broker"]) == 2
    assert "needs somewhere to listen: --socket PATH" in capsys.readouterr().err
    monkeypatch.setenv("JUPYTER_GPUSHARE_BROKER_URL", f"unix:{tmp_path}/other.sock")
    assert main(["broker", "--socket", str(tmp_path / "b.sock")]) == 2
    assert "points it at another broker" in capsys.readouterr().err
    assert not (tmp_path / "b.sock").exists()


def test_the_clients_broker_url_naming_the_broker_is_no_setting_of_its_own() -> None:
    """/etc/jupyter's broker_url (or /etc/environment's) reaches root's broker too: the team-box
    steps set it for every user, then the broker restarts."""
    from jupyter_gpushare.broker.settings import GPUShareBroker, names_this_broker

    on_socket = GPUShareBroker(socket="/run/jupyter-gpushare/broker.sock")
    assert names_this_broker("unix:/run/jupyter-gpushare/broker.sock", on_socket)
    assert not names_this_broker("unix:/run/other/broker.sock", on_socket)
    assert not names_this_broker("http://hub:8765/", on_socket)
    on_http = GPUShareBroker(ip="0.0.0.0", port=8765)
    assert names_this_broker("http://hub:8765/", on_http)
    assert not names_this_broker("http://hub:9000/", on_http)


def test_status_through_a_broker_that_is_not_there_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_BROKER_URL", f"unix:{tmp_path}/none.sock")
    assert main(["status"]) == 1  # a fault of the pool's keeper, as a broken ledger is
    err = capsys.readouterr().err
    assert f"the GPU broker at unix:{tmp_path}/none.sock is not reachable" in err and "Traceback" not in err


def test_status_on_a_damaged_ledger_is_one_sentence_and_exit_status_1(
    ledger_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hold(ledger_path, "k1", "alice", "4G", current_process())
    ledger_path.write_bytes(b"garbage " * 1024)
    assert main(["status"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"jupyter gpushare: error: The GPU ledger {ledger_path} is damaged")
    assert f"mv {ledger_path} {ledger_path}.broken" in line
