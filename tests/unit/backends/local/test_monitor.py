"""One sampling round of the usage monitor against a real ledger and a real process."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.processes import identify, is_alive
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.sizes import GiB
from tests.support.polling import wait_until


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    # SIGINT as a kernel meets it: a test run started in the background by a shell (nohup …
    # &) hands its children SIGINT ignored, and `sleep` would then survive the interrupt.
    process = subprocess.Popen(["sleep", "60"], preexec_fn=_default_sigint)
    yield process
    process.kill()
    process.wait()


def service(tmp_path: Path, **settings: object) -> LocalBackend:
    return LocalBackend(
        GPUShare(simulate="1xA100-80GB", ledger_path=str(tmp_path / "ledger.sqlite"), **settings)
    )


async def take(svc: LocalBackend, kernel_id: str, size: str, pid: int) -> None:
    await svc.acquire(kernel_id, svc.check(size))
    svc.attach_kernel(kernel_id, pid)


@pytest.mark.parametrize("action", ["warn", "interrupt", "kill"])
async def test_over_limit_acts_once_and_records_why(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], action: str
) -> None:
    svc = service(tmp_path, over_limit_action=action)
    await take(svc, "k1", "4G", sleeper.pid)
    svc.ledger.report_usage("k1", 5 * GiB, 20, "simulated")
    identity = identify(sleeper.pid)
    assert identity is not None

    assert svc.monitor.sample_once() == 1
    record = svc.ledger.get("k1")
    assert record is not None
    assert "above its slice: using 5G of 4G (125%)" in record.warnings
    assert any(f"over_limit_action={action}" in warning for warning in record.warnings)
    # The kernel's own report is kept, not overwritten by the sampler.
    assert (record.memory_used, record.utilization, record.usage_source) == (5 * GiB, 20, "simulated")

    if action != "warn":
        wait_until(lambda: not is_alive(identity), 5, 0.05, f"the end of `sleep` by {action}")
    # `sleep` dies of SIGINT and of SIGKILL alike; "warn" leaves it running.
    assert is_alive(identity) is (action == "warn")


async def test_the_action_is_edge_triggered(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    svc = service(tmp_path, over_limit_action="warn")
    await take(svc, "k1", "4G", sleeper.pid)
    acted: list[str] = []
    svc.monitor._act = lambda record, usage, device: acted.append(record.kernel_id)  # type: ignore[method-assign]
    svc.ledger.report_usage("k1", 5 * GiB, None, "simulated")
    svc.monitor.sample_once()
    svc.monitor.sample_once()
    assert acted == ["k1"]
    svc.ledger.report_usage("k1", 1 * GiB, None, "simulated")
    svc.monitor.sample_once()
    svc.ledger.report_usage("k1", 6 * GiB, None, "simulated")
    svc.monitor.sample_once()
    assert acted == ["k1", "k1"]


async def test_hard_modes_warn_but_never_act(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    svc = service(tmp_path, over_limit_action="kill")
    await svc.acquire("k1", svc.check("4G", "vgpu"))
    svc.attach_kernel("k1", sleeper.pid)
    svc.ledger.report_usage("k1", 5 * GiB, None, "simulated")
    svc.monitor.sample_once()
    record = svc.ledger.get("k1")
    assert record is not None and any("above its slice" in warning for warning in record.warnings)
    assert not any("over_limit_action" in warning for warning in record.warnings)
    assert sleeper.poll() is None


async def test_device_usage_is_the_sum_of_declared_usage(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    svc = service(tmp_path)
    await take(svc, "a", "8G", sleeper.pid)
    await take(svc, "b", "8G", sleeper.pid)
    svc.ledger.report_usage("a", 3 * GiB, 50, "simulated")
    svc.ledger.report_usage("b", 2 * GiB, 70, "simulated")
    svc.monitor.sample_once()
    device = svc.pool()["devices"][0]
    assert device["memory_used"] == 5 * GiB
    assert device["utilization"] == 100  # capped at the device's 100%
