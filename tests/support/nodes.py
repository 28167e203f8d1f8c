"""A simulated node for the integration tests: isolated Jupyter directories, a simulated pool,
its own ledger and gpushare kernelspecs (the ``node`` fixture of tests/integration/conftest.py)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config.kernelspecs import install_kernelspecs
from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import GiB

BIN = Path(sys.executable).parent

# The kernel image of the Kubernetes backend's tests, and one no node can pull.
IMAGE = "jupyter-gpushare-kernel:test"
BROKEN_IMAGE = "registry.example.com/jupyter-gpushare-kernel:missing"


@dataclass
class Node:
    """An isolated Jupyter environment with a simulated pool and its own ledger."""

    root: Path
    ledger_path: Path
    env: dict[str, str]
    capacity: int

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.ledger_path)

    def running(self) -> list[SliceRecord]:
        return [record for record in self.ledger.records() if record.state == "running"]

    def queued(self) -> list[SliceRecord]:
        return [record for record in self.ledger.records() if record.state == "queued"]

    def reserved(self) -> int:
        return sum(record.memory for record in self.running())

    def write_server_config(self, gpushare: dict[str, object], **sections: dict[str, object]) -> None:
        """The servers' config file: ``c.GPUShare``, and other classes' sections by name."""
        config_dir = Path(self.env["JUPYTER_CONFIG_DIR"])
        config = {"GPUShare": gpushare, **sections}
        (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))


def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    """The ``node`` fixture's environment in ``tmp_path`` (for fixtures of a wider scope)."""
    prefix = tmp_path / "prefix"
    paths = {
        "JUPYTER_CONFIG_DIR": tmp_path / "config",
        "JUPYTER_DATA_DIR": tmp_path / "data",
        "JUPYTER_RUNTIME_DIR": tmp_path / "runtime",
        "IPYTHONDIR": tmp_path / "ipython",
    }
    for path in paths.values():
        path.mkdir()
    env = {name: str(path) for name, path in paths.items()}
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    env["JUPYTER_GPUSHARE_SIMULATE"] = "1xA100-80GB"
    env["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(tmp_path / "ledger.sqlite")
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    install_kernelspecs(["30G", "4G", "16G"], prefix=str(prefix))
    return Node(tmp_path, tmp_path / "ledger.sqlite", dict(os.environ), 80 * GiB)
