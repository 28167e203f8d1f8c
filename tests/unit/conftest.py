"""Shared fixtures for the unit tests.

Every test runs with its own Jupyter directories and without any ``JUPYTER_GPUSHARE_*`` variable
from the caller's shell, and with NVML (the one edge we do not own) replaced: by default it is
"not installed"; the ``fake_nvml`` fixture installs a fake ``pynvml`` module describing boards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from jupyter_gpushare.backends.local.inventory import nvml as nvml_module
from tests.support.nvml_fake import FakeNVMLState, make_fake_pynvml

# Property tests: a quick profile for every run, a thorough one to hunt for rare cases
# (GPUSHARE_HYPOTHESIS_PROFILE=thorough pytest tests/unit).
settings.register_profile(
    "unit", max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", settings.get_profile("unit"), max_examples=5000)
settings.load_profile(os.environ.get("GPUSHARE_HYPOTHESIS_PROFILE", "unit"))


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("jupyter-home")
    for name in list(os.environ):
        if name.startswith("JUPYTER_GPUSHARE_"):
            monkeypatch.delenv(name)
    for name in ("JUPYTER_CONFIG_PATH", "JUPYTER_PATH", "JUPYTERHUB_USER", "CUDA_MPS_PIPE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(home / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(home / "runtime"))
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "0")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")

    def not_installed() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml_module, "_nvml", not_installed)


InstallFakeNVML = Callable[..., FakeNVMLState]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> InstallFakeNVML:
    """``fake_nvml(boards, init_error=..., count_error=...)`` makes NVML report ``boards``."""

    def install(boards: Sequence[Any] = (), **options: Any) -> FakeNVMLState:
        module, state = make_fake_pynvml(boards, **options)
        monkeypatch.setattr(nvml_module, "_nvml", lambda: module)
        return state

    return install
