"""A kernel pod's side of the conversation with its server, without a server (pure paths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jupyter_gpushare.backends.broker_client.transport import UnreachableError
from jupyter_gpushare.core.errors import GPUShareError, NeedsRestartError
from jupyter_gpushare.core.sizes import GiB, SizeError
from jupyter_gpushare.kernel.pod_handle import PodSliceHandle


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
