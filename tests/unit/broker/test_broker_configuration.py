"""Where a broker started by hand finds its settings, and the lines it starts with (issue 25)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.broker.side import BROKER_LEDGER
from jupyter_gpushare.broker.app import socket_directory
from jupyter_gpushare.broker.banner import startup_lines
from jupyter_gpushare.broker.settings import load_broker_configuration


@pytest.fixture
def jupyter_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Root's own Jupyter config directory, with a server config of its own."""
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "root-jupyter"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "")
    for variable in (
        "JUPYTER_GPUSHARE_LEDGER_PATH",
        "JUPYTER_GPUSHARE_SIMULATE",
        "JUPYTER_GPUSHARE_BROKER_URL",
    ):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "root-jupyter").mkdir()
    (tmp_path / "root-jupyter" / "jupyter_server_config.py").write_text(
        'c.GPUShare.max_memory_per_kernel = "40G"\nc.GPUShare.default_memory = "2G"\n'
    )
    return tmp_path


def test_its_own_directory_comes_first_and_the_ledger_is_its_own(jupyter_dirs: Path) -> None:
    own = jupyter_dirs / "etc-jupyter-gpushare"
    own.mkdir()
    (own / "jupyter_server_config.py").write_text(
        'c.GPUShare.max_memory_per_kernel = "16G"\nc.GPUShareBroker.admin_users = ["ada"]\n'
    )
    configuration = load_broker_configuration(str(own), {"socket": "/run/x/broker.sock"})
    settings = configuration.settings
    assert settings.max_memory_per_kernel == "16G"  # its own directory wins
    assert settings.default_memory == "2G"  # the Jupyter config path still counts
    assert configuration.broker.admin_users == ["ada"] and configuration.broker.socket == "/run/x/broker.sock"
    assert configuration.files == (
        own / "jupyter_server_config.py",
        jupyter_dirs / "root-jupyter" / "jupyter_server_config.py",
    )
    # Not root's runtime directory's ledger, which a make demo may have filled.
    assert str(settings.effective_ledger_path()) == BROKER_LEDGER


def test_a_ledger_path_given_is_kept(jupyter_dirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(jupyter_dirs / "mine.sqlite"))
    settings = load_broker_configuration(str(jupyter_dirs / "none")).settings
    assert settings.effective_ledger_path() == jupyter_dirs / "mine.sqlite"
    kubernetes = load_broker_configuration(str(jupyter_dirs / "none"), backend="kubernetes").settings
    assert kubernetes.backend == "kubernetes"


def test_the_startup_lines_say_the_pool_the_limits_and_the_files(jupyter_dirs: Path) -> None:
    configuration = load_broker_configuration(str(jupyter_dirs / "absent"))
    pool = {
        "backend": "local",
        "simulated": True,
        "overcommit": 1.0,
        "queue": [],
        "devices": [{"id": 0, "name": "Simulated A100-80GB"}],
    }
    lines = startup_lines(
        "local",
        "ledger /l.sqlite",
        ["unix:/run/b.sock"],
        pool,  # type: ignore[arg-type]
        configuration.settings,
        configuration.broker,
        configuration,
    )
    assert lines[0] == "GPU broker (local backend, ledger /l.sqlite) serving unix:/run/b.sock"
    assert lines[1] == (
        "GPU broker pool: 1 simulated device(s) remembered by the ledger, which a process with "
        "JUPYTER_GPUSHARE_SIMULATE registered: GPU0 Simulated A100-80GB"
    )
    assert lines[2].startswith("GPU broker limits: max_memory_per_user none, max_memory_per_kernel 40G, ")
    assert (
        lines[3] == f"GPU broker configuration: {jupyter_dirs / 'root-jupyter' / 'jupyter_server_config.py'}"
    )
    empty = {**pool, "devices": [], "simulated": False, "problem": "no GPU found: NVML could not start"}
    assert startup_lines("local", "l", [], empty, configuration.settings, configuration.broker, None)[1] == (  # type: ignore[arg-type]
        "GPU broker pool: empty (no GPU found: NVML could not start)"
    )


def test_the_socket_directory_is_made_for_every_user_to_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Failed before: made under the broker's umask 0077, it was 0700 and every user was told
    the broker was not reachable."""
    previous = os.umask(0o077)
    try:
        socket_directory(tmp_path / "run" / "jupyter-gpushare")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "run" / "jupyter-gpushare").stat().st_mode) == 0o755
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    with caplog.at_level(logging.WARNING, logger="jupyter_gpushare.broker"):
        socket_directory(closed)
    assert f"the socket's directory {closed} is mode 0700: no other user can reach the socket" in caplog.text
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700  # an existing one is the admin's choice
