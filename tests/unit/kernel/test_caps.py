"""Framework caps: the real PyTorch (CPU build) with only its CUDA device query substituted,
and the import hook in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.sizes import GiB
from jupyter_gpushare.kernel import caps


@pytest.fixture
def slice_of_4g(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_names.MEMORY_BYTES, str(4 * GiB))


def test_torch_without_cuda_is_left_alone(slice_of_4g: None) -> None:
    result = caps.apply("torch", torch)
    assert result is not None and not result.applied
    assert "no CUDA device" in result.detail


def test_torch_with_a_cuda_device_gets_its_fraction(
    slice_of_4g: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[float, int]] = []
    # Only the CUDA edge is substituted: the device query and the allocator setting it reaches.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=16 * GiB)
    )
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda fraction, device: calls.append((fraction, device)),
    )
    result = caps.apply("torch", torch)
    assert result is not None and result.applied
    # The 4G slice less 768 MiB for the CUDA context, which NVML counts and the fraction does not.
    assert calls == [((4 * GiB - 768 * 2**20) / (16 * GiB), 0)] == [(0.203125, 0)]
    assert "0.2031" in result.detail


def test_a_slice_larger_than_the_device_caps_at_the_whole_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env_names.MEMORY_BYTES, str(32 * GiB))
    calls: list[float] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=16 * GiB)
    )
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append(f))
    caps.apply("torch", torch)
    assert calls == [1.0]


def test_a_failing_framework_never_breaks_the_import(
    slice_of_4g: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> bool:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    result = caps.apply("torch", torch)
    assert result is not None and not result.applied
    assert "RuntimeError: driver exploded" in result.detail


def test_no_slice_means_no_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env_names.MEMORY_BYTES, raising=False)
    assert caps.apply("torch", torch) is None


class FakeTensorFlowConfig:
    """TensorFlow's ``tf.config`` surface (TensorFlow itself is too large to install here)."""

    def __init__(self, gpus: list[str], initialised: bool = False) -> None:
        self.gpus = gpus
        self.initialised = initialised
        self.configured: list[tuple[str, list[Any]]] = []

    def list_physical_devices(self, kind: str) -> list[str]:
        return self.gpus if kind == "GPU" else []

    def set_logical_device_configuration(self, device: str, configs: list[Any]) -> None:
        if self.initialised:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self.configured.append((device, configs))

    @staticmethod
    def LogicalDeviceConfiguration(memory_limit: int) -> Any:
        return SimpleNamespace(memory_limit=memory_limit)


def test_tensorflow_gets_a_logical_device_limit_in_mib(slice_of_4g: None) -> None:
    config = FakeTensorFlowConfig(["GPU:0"])
    result = caps.apply("tensorflow", SimpleNamespace(config=config))
    assert result is not None and result.applied
    assert config.configured[0][0] == "GPU:0"
    assert config.configured[0][1][0].memory_limit == 4096


def test_tensorflow_already_initialised_says_restart(slice_of_4g: None) -> None:
    result = caps.apply("tensorflow", SimpleNamespace(config=FakeTensorFlowConfig(["GPU:0"], True)))
    assert result is not None and not result.applied and "restart the kernel" in result.detail


def test_tensorflow_without_gpu_is_left_alone(slice_of_4g: None) -> None:
    result = caps.apply("tensorflow", SimpleNamespace(config=FakeTensorFlowConfig([])))
    assert result is not None and not result.applied


def test_cupy_pool_gets_the_byte_limit(slice_of_4g: None) -> None:
    limits: list[int] = []
    cupy = SimpleNamespace(
        cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)),
        get_default_memory_pool=lambda: SimpleNamespace(set_limit=lambda size: limits.append(size)),
    )
    result = caps.apply("cupy", cupy)
    assert (
        result is not None and result.applied and limits == [4 * GiB - 768 * 2**20]
    )  # less the CUDA context allowance


def test_the_import_hook_caps_torch_when_it_is_first_imported() -> None:
    script = (
        "import json, sys\n"
        "from jupyter_gpushare.kernel import caps\n"
        "caps.install_import_hook()\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "import torch.nn\n"  # submodules import normally through the wrapped loader
        "print(json.dumps({k: [v.applied, v.detail] for k, v in caps.results().items()}))\n"
    )
    env = dict(os.environ, **{env_names.MEMORY_BYTES: str(4 * GiB)})
    output = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    results = json.loads(output.stdout)
    assert results == {"torch": [False, "no CUDA device (CPU build or no GPU): nothing to cap"]}
    assert output.stderr == ""


def test_only_live_resizable_frameworks_are_reapplied(
    slice_of_4g: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "jax", SimpleNamespace())
    assert "jax" in caps.imported_needing_restart()
    reapplied = {result.framework for result in caps.reapply_imported()}
    assert "jax" not in reapplied and "torch" in reapplied
