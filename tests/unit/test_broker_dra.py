"""The broker and Dynamic Resource Allocation: the broker creates kernel pods and Secrets but no
ResourceClaims yet, so it refuses a DRA preset at start, in one sentence, before any cluster call
(its pods would otherwise wait for ever for a claim nobody makes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpushare.broker.app import refuse_dra_presets
from jupyter_gpushare.cli import main
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.errors import ConfigurationError


def test_the_broker_refuses_a_dra_preset_before_touching_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))  # no configuration files
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "nvidia-dra")
    assert main(["broker", "--backend", "kubernetes", "--ip", "127.0.0.1", "--port", "9"]) == 2
    error = capsys.readouterr().err
    assert "the broker does not create ResourceClaims yet" in error and "'nvidia-dra'" in error
    assert "Traceback" not in error


@pytest.mark.parametrize("preset", ["hami-dra", "dra"])
def test_every_dra_preset_is_refused_and_no_device_plugin_preset(preset: str) -> None:
    settings = GPUShare(backend="kubernetes", resource_preset=preset, dra_driver="gpu.example.com")
    with pytest.raises(ConfigurationError, match="does not create ResourceClaims"):
        refuse_dra_presets(settings)
    refuse_dra_presets(GPUShare(backend="kubernetes", resource_preset="hami"))  # no error
