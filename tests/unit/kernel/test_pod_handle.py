"""A kernel pod's side of the conversation with its server, without a server (pure paths), and
what it measures of its GPU: through the real ``pynvml`` over the simulated NVML library
(tests/support/nvml_sim), in a process of its own as a kernel in its container."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.broker_client.transport import UnreachableError
from jupyter_gpushare.core.errors import GPUShareError, NeedsRestartError
from jupyter_gpushare.core.sizes import GiB, MiB, SizeError
from jupyter_gpushare.kernel.pod_handle import PodSliceHandle
from tests.support.nvml_sim import SimulatedCard, driver_root, write_state


def pod_env(tmp_path: Path, report_url: str = "") -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    env = {
        "JUPYTER_GPUSHARE_KERNEL_ID": "k-1",
        "JUPYTER_GPUSHARE_MODE": "vgpu",
        "JUPYTER_GPUSHARE_MEMORY_BYTES": str(6 * GiB),
        "JUPYTER_GPUSHARE_TOKEN_FILE": str(token),
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
    }
    if report_url:
        env["JUPYTER_GPUSHARE_REPORT_URL"] = report_url
    return env


def test_the_pod_reads_its_slice_and_token_from_its_environment(tmp_path: Path) -> None:
    handle = PodSliceHandle(pod_env(tmp_path, "http://10.0.0.1:8888/user/a/api/gpushare/kernels/k-1/usage"))
    assert (handle.kernel_id, handle.mode, handle.memory, handle.interval) == ("k-1", "vgpu", 6 * GiB, 0.5)
    assert handle.kernel_url == "http://10.0.0.1:8888/user/a/api/gpushare/kernels/k-1"
    assert handle._token == "secret-token"


def test_without_a_server_the_pod_says_so_and_reports_nothing(tmp_path: Path) -> None:
    handle = PodSliceHandle(pod_env(tmp_path))
    with pytest.raises(UnreachableError, match="started without a server to report to"):
        handle.view()
    handle.report_once()  # nothing to report to: no error, no thread
    handle.start_reporting()
    assert handle._thread is None


def test_an_unreachable_server_is_named(tmp_path: Path) -> None:
    handle = PodSliceHandle(pod_env(tmp_path, "http://127.0.0.1:9/api/gpushare/kernels/k-1/usage"))
    with pytest.raises(UnreachableError, match=re.escape("cannot reach the server at http://127.0.0.1:9")):
        handle.view()
    handle.declared = (1, None)
    handle.report_once()  # the reporter thread's path: logged once, never raised


def test_bad_declarations_and_resizes_change_nothing(tmp_path: Path) -> None:
    handle = PodSliceHandle(pod_env(tmp_path))
    assert handle.measure() is None  # no declaration, and PyTorch has not used CUDA here
    with pytest.raises(SizeError):
        handle.declare("abc")
    with pytest.raises(GPUShareError, match="utilization must be a whole percentage 0-100"):
        handle.declare("1G", 101)
    assert handle.declared is None
    with pytest.raises(SizeError):
        handle.resize("abc", restart=True)
    refusal = re.escape("nothing was changed. Run %gpu resize 8G --restart")
    with pytest.raises(NeedsRestartError, match=refusal):
        handle.resize("8G", restart=False)
    handle.declared = (2 * GiB, 40)
    assert handle.measure() == (2 * GiB, 40, "simulated")


# ---- what a pod kernel measures: NVML where it holds whole cards ----------------------------------

# A kernel's process measuring on each line it reads. PyTorch stands in as a module that says it
# holds 1 GiB: what the kernel reports without NVML, so that a test sees which figure won.
POD_KERNEL = """
import json, sys, types
cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                             device_count=lambda: 1, memory_reserved=lambda index: 1 << 30)
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)
from jupyter_gpushare.kernel.pod_handle import PodSliceHandle
handle = PodSliceHandle()
for _ in sys.stdin:
    cards = getattr(handle, "_whole_cards", None)
    print(json.dumps([handle.measure(), getattr(cards, "problem", None)]), flush=True)
"""
TORCH_FIGURE = [GiB, None, "kernel"]


def card(uuid: str, used: int, utilization: int | None = 0) -> SimulatedCard:
    return SimulatedCard(
        uuid, "NVIDIA H200", 140 * GiB, used, memory_reserved=615 * MiB, utilization=utilization
    )


class PodKernel:
    """A kernel process as a pod of ``mode`` runs it: given the cards ``visible`` names, with the
    simulated driver's library and state, as the container toolkit's stand-in sets it up."""

    def __init__(self, tmp_path: Path, mode: str, state: Path, visible: str) -> None:
        env = {
            **os.environ,
            **pod_env(tmp_path),
            "JUPYTER_GPUSHARE_MODE": mode,
            **driver_root().environment(state),
            "NVIDIA_VISIBLE_DEVICES": visible,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-c", POD_KERNEL],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self) -> tuple[list[Any] | None, str | None]:
        """``(measure()'s answer, the NVML problem the handle keeps)``."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the kernel process ended: {self.process.wait()}"
        measured, problem = json.loads(line)
        return measured, problem

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def pod_kernels(tmp_path: Path) -> Iterator[list[PodKernel]]:
    started: list[PodKernel] = []
    yield started
    for kernel in started:
        kernel.close()


def start(started: list[PodKernel], tmp_path: Path, mode: str, state: Path, visible: str) -> PodKernel:
    kernel = PodKernel(tmp_path, mode, state, visible)
    started.append(kernel)
    return kernel


def cards_at(tmp_path: Path, cards: Sequence[SimulatedCard]) -> Path:
    return write_state(tmp_path / "nvml" / "state", cards)


def test_a_pod_holding_its_card_reports_what_nvml_says_the_card_uses(
    tmp_path: Path, pod_kernels: list[PodKernel]
) -> None:
    state = cards_at(tmp_path, [card("GPU-a", 5 * GiB), card("GPU-b", 3 * GiB, utilization=70)])
    kernel = start(pod_kernels, tmp_path, "exclusive", state, "GPU-b")
    # Its one card, not the neighbour's; without the driver's reserve; over PyTorch's figure.
    assert kernel.measure() == ([3 * GiB, 70, "kernel"], None)
    write_state(state, [card("GPU-a", 5 * GiB), card("GPU-b", 4 * GiB, utilization=None)])
    assert kernel.measure() == ([4 * GiB, None, "kernel"], None)  # each report reads NVML again


def test_a_pod_holding_two_cards_reports_both(tmp_path: Path, pod_kernels: list[PodKernel]) -> None:
    state = cards_at(tmp_path, [card("GPU-a", 5 * GiB, 20), card("GPU-b", GiB), card("GPU-c", 2 * GiB, 60)])
    kernel = start(pod_kernels, tmp_path, "exclusive", state, "GPU-c,GPU-a")
    assert kernel.measure() == ([7 * GiB, 40, "kernel"], None)  # the memory summed, the busy mean


@pytest.mark.parametrize("mode", ["timeslice", "mps", "vgpu"])
def test_a_pod_on_a_shared_card_does_not_take_the_card_s_use_for_its_own(
    tmp_path: Path, pod_kernels: list[PodKernel], mode: str
) -> None:
    """NVML would answer (the card is in the container), but with the neighbours' use in it."""
    state = cards_at(tmp_path, [card("GPU-a", 9 * GiB, utilization=90)])
    kernel = start(pod_kernels, tmp_path, mode, state, "GPU-a")
    assert kernel.measure() == (TORCH_FIGURE, None)


@pytest.mark.parametrize(
    ("state_written", "visible", "problem"),
    [
        (False, "GPU-a", "NVML cannot be read in this pod: Driver Not Loaded"),
        (True, "void", "NVML cannot be read in this pod: it shows no GPU in this container"),
    ],
)
def test_nvml_failing_in_a_pod_is_kept_and_never_raised(
    tmp_path: Path, pod_kernels: list[PodKernel], state_written: bool, visible: str, problem: str
) -> None:
    cards = [card("GPU-a", 5 * GiB)]
    state = cards_at(tmp_path, cards) if state_written else tmp_path / "nvml" / "state"
    kernel = start(pod_kernels, tmp_path, "exclusive", state, visible)
    assert kernel.measure() == (TORCH_FIGURE, problem)  # PyTorch's figure, as before
    cards_at(tmp_path, cards)
    assert kernel.measure() == (TORCH_FIGURE, problem)  # not tried again every second
