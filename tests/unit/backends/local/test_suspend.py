"""Suspend and resume through the backend, against a substituted CUDA driver edge.

Only the driver's checkpoint calls are replaced (``checkpoint_fake``, run in this process by
``InProcessRunner``); the flows, the backend, the queue and the ledger (a real sqlite file) are
the package's own. NVML, where a test needs it, is ``nvml_fake`` as everywhere else.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.local import suspend as suspending
from jupyter_gpushare.backends.local.checkpoint import InProcessRunner
from jupyter_gpushare.backends.local.checkpoint.driver import DriverError, NotSupported
from jupyter_gpushare.core.errors import CannotSuspendError, DoesNotFitError, NoSliceError, ResumeError
from tests.support.checkpoint_fake import Failure, FakeCheckpointDriver
from tests.support.nvml_fake import FakeBoard, FakeProcess
from tests.support.polling import async_wait_until
from tests.unit.backends.local.test_local_backend import make_service

GiB = 2**30


def backend(tmp_path: Path, driver: FakeCheckpointDriver, simulate: str = "1xT4-16GB") -> LocalBackend:
    service = make_service(tmp_path, simulate=simulate, when_full="queue")
    service.runner = InProcessRunner(driver)
    return service


async def start(service: LocalBackend, kernel_id: str, size: str, used: float = 0) -> None:
    await service.acquire(kernel_id, service.check(size, kernel_id=kernel_id))
    service.attach_kernel(kernel_id, os.getpid())
    if used:
        service.ledger.report_usage(kernel_id, int(used * GiB), None, "simulated")


def reserved(service: LocalBackend, device: int = 0) -> int:
    return service.pool()["devices"][device]["memory_reserved"]


@pytest.fixture
def driver() -> FakeCheckpointDriver:
    return FakeCheckpointDriver()


@pytest.fixture
def service(tmp_path: Path, driver: FakeCheckpointDriver) -> Iterator[LocalBackend]:
    service = backend(tmp_path, driver)
    yield service
    service.ledger.close()


async def test_the_slice_goes_back_only_once_the_driver_reports_the_checkpoint_done(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G", used=3.8)
    driver.hold["checkpoint"] = threading.Event()
    suspending_thread = asyncio.create_task(asyncio.to_thread(service.suspend, "k1"))
    assert await asyncio.to_thread(driver.entered.setdefault("checkpoint", threading.Event()).wait, 10)
    # The driver is still moving the state: the slice is the kernel's.
    record = service.ledger.get("k1")
    assert record is not None and record.state == "running" and reserved(service) == 4 * GiB
    driver.hold["checkpoint"].set()
    outcome = await suspending_thread
    assert driver.states[os.getpid()] == "checkpointed"
    assert [name for name, *_ in driver.calls if name != "state"] == ["lock", "checkpoint"]
    assert service.ledger.get("k1") is None and reserved(service) == 0
    assert outcome.state.state_bytes == int(3.8 * GiB) and outcome.state.checkpointed
    view = next(view for view in service.all_kernels() if view["kernel_id"] == "k1")
    assert view["state"] == "suspended" and view["held"] == 0


async def test_a_failed_checkpoint_keeps_the_slice_and_says_why(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G", used=3.8)
    driver.fail["checkpoint"] = Failure(
        DriverError("cuCheckpointProcessCheckpoint: CUDA_ERROR_OUT_OF_MEMORY", 2)
    )
    with pytest.raises(CannotSuspendError) as refused:
        service.suspend("k1")
    message = str(refused.value)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in message and "it runs on as before" in message
    assert "it keeps its 4G slice on GPU0" in message
    assert driver.states[os.getpid()] == "running"  # unlocked again
    record = service.ledger.get("k1")
    assert record is not None and record.state == "running" and reserved(service) == 4 * GiB
    assert service.ledger.released("k1") is None


async def test_an_old_driver_is_named_with_the_version_needed(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    driver.api = 12040
    await start(service, "k1", "4G", used=1)
    with pytest.raises(CannotSuspendError, match=r"CUDA 12\.8 driver API .*this driver offers CUDA 12\.4"):
        service.suspend("k1")
    assert not driver.named("lock") and service.ledger.get("k1") is not None


async def test_a_lock_timeout_says_to_suspend_when_no_cell_runs(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G", used=1)
    driver.fail["lock"] = Failure(DriverError("cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT", 909))
    with pytest.raises(
        CannotSuspendError, match="did not finish within 10 s; suspend it when no cell is running"
    ):
        service.suspend("k1")
    assert service.ledger.get("k1") is not None


async def test_host_memory_is_checked_first(service: LocalBackend, driver: FakeCheckpointDriver) -> None:
    await start(service, "k1", "4G", used=3.8)
    with pytest.raises(CannotSuspendError) as refused:
        suspending.suspend(service, "k1", host_available=lambda: 2 * GiB)
    assert "3.8G of GPU state does not fit in host memory: 2G available, 4.3G needed" in str(refused.value)
    assert not driver.calls and service.ledger.get("k1") is not None


async def test_several_cuda_processes_in_the_kernels_tree_are_refused(
    tmp_path: Path, driver: FakeCheckpointDriver, fake_nvml
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        board = FakeBoard("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA L4", 24 * GiB)
        board.processes = [
            FakeProcess(os.getpid(), 2 * GiB),
            FakeProcess(child.pid, GiB),
            FakeProcess(1, GiB),
        ]
        fake_nvml([board])
        service = backend(tmp_path, driver, simulate="")
        await start(service, "k1", "8G")
        with pytest.raises(CannotSuspendError) as refused:
            service.suspend("k1")
        # pid 1 is not in the kernel's tree: someone else's, not counted.
        assert f"2 of its processes use the GPU (pids {min(os.getpid(), child.pid)}" in str(refused.value)
        assert not driver.calls and service.ledger.get("k1") is not None
        # What a release leaves reserved is NVML's per-process figure for the tree.
        _, held = service.give_back("k1")
        assert held.memory == 3 * GiB and held.source == "nvml"
    finally:
        child.kill()
        child.wait()


async def test_bad_requests_change_nothing(service: LocalBackend, driver: FakeCheckpointDriver) -> None:
    with pytest.raises(NoSliceError, match="holds no GPU slice to suspend"):
        service.suspend("nobody")
    with pytest.raises(NoSliceError, match="not suspended"):
        await service.resume("nobody")
    await start(service, "k1", "4G", used=1)
    with pytest.raises(NoSliceError, match="not suspended: it holds its 4G slice"):
        await service.resume("k1")
    service.suspend("k1")
    with pytest.raises(NoSliceError, match="suspended already"):
        service.suspend("k1")
    with pytest.raises(NoSliceError, match="suspended: it holds no GPU slice to release"):
        service.give_back("k1")
    assert service.ledger.released("k1").suspended is not None  # type: ignore[union-attr]
    assert len(driver.named("checkpoint")) == 1


async def test_a_resume_waits_in_the_queue_like_a_start(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G", used=3.8)
    service.suspend("k1")
    await start(service, "k2", "14G")
    positions: list[int] = []
    resuming = asyncio.create_task(
        service.resume("k1", on_wait=lambda position, _: positions.append(position))
    )
    await async_wait_until(lambda: positions, 60, 0.02, "the resume queued")
    assert positions == [1] and not driver.named("restore")
    view = next(view for view in service.all_kernels() if view["kernel_id"] == "k1")
    assert view["state"] == "queued" and driver.states[os.getpid()] == "checkpointed"
    service.free("k2")
    outcome = await asyncio.wait_for(resuming, 10)
    assert driver.states[os.getpid()] == "running" and driver.named("restore") == [
        ("restore", os.getpid(), ())
    ]
    record = service.ledger.get("k1")
    assert record is not None and record.memory == 4 * GiB and record.memory_used == int(3.8 * GiB)
    assert outcome.device.label == "GPU0" and service.ledger.released("k1") is None


async def test_a_resume_that_times_out_stays_suspended(tmp_path: Path, driver: FakeCheckpointDriver) -> None:
    service = make_service(tmp_path, simulate="1xT4-16GB", when_full="fail")
    service.runner = InProcessRunner(driver)
    await start(service, "k1", "4G", used=1)
    service.suspend("k1")
    await start(service, "k2", "14G")
    with pytest.raises(DoesNotFitError):
        await service.resume("k1")
    assert service.ledger.released("k1").suspended is not None  # type: ignore[union-attr]
    assert not driver.named("restore")


async def test_a_resume_goes_onto_another_card_of_the_same_chip(tmp_path: Path) -> None:
    driver = FakeCheckpointDriver(api=13010)
    service = backend(tmp_path, driver, simulate="2xT4-16GB")
    gpu0, gpu1 = (device.uuid for device in service.devices())
    await start(service, "k1", "4G", used=2)
    assert service.ledger.get("k1").device_uuid == gpu0  # type: ignore[union-attr]
    service.suspend("k1")
    await start(service, "big", "15G")  # GPU0 is taken
    outcome = await service.resume("k1")
    assert outcome.device.uuid == gpu1
    ((_, _, pairs),) = driver.named("restore")
    assert dict(pairs) == {gpu0: gpu1, gpu1: gpu0}


async def test_a_driver_that_cannot_remap_waits_for_the_same_card(tmp_path: Path) -> None:
    driver = FakeCheckpointDriver(api=12080)
    service = backend(tmp_path, driver, simulate="2xT4-16GB")
    gpu0 = service.devices()[0].uuid
    await start(service, "k1", "4G", used=2)
    service.suspend("k1")
    await start(service, "big", "15G")
    positions: list[int] = []
    resuming = asyncio.create_task(
        service.resume("k1", on_wait=lambda position, _: positions.append(position))
    )
    await async_wait_until(lambda: positions, 60, 0.02, "the resume queued")
    service.free("big")
    outcome = await asyncio.wait_for(resuming, 10)
    assert outcome.device.uuid == gpu0 and driver.named("restore")[0][2] == ()


async def test_a_failed_restore_stays_suspended_and_gives_the_new_slice_back(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G", used=1)
    service.suspend("k1")
    driver.fail["restore"] = Failure(DriverError("cuCheckpointProcessRestore: CUDA_ERROR_OUT_OF_MEMORY", 2))
    with pytest.raises(ResumeError, match=r"could not be resumed on GPU0: .*stays suspended"):
        await service.resume("k1")
    assert service.ledger.get("k1") is None and reserved(service) == 0
    assert service.ledger.released("k1").suspended is not None  # type: ignore[union-attr]
    await service.resume("k1")  # the next try works
    assert service.ledger.get("k1") is not None and driver.states[os.getpid()] == "running"


async def test_a_kernel_holding_nothing_suspends_without_the_driver(
    service: LocalBackend, driver: FakeCheckpointDriver
) -> None:
    await start(service, "k1", "4G")
    outcome = service.suspend("k1")
    assert not outcome.state.checkpointed and not driver.calls and reserved(service) == 0
    await service.resume("k1")
    assert not driver.calls and service.ledger.get("k1") is not None


async def test_a_mig_instance_says_it_cannot_be_suspended(
    tmp_path: Path, driver: FakeCheckpointDriver
) -> None:
    service = backend(tmp_path, driver, simulate="1xA100-80GB:mig=1x3g.40gb+2x1g.10gb")
    await service.acquire("k1", service.check("5G", "mig"))
    service.attach_kernel("k1", os.getpid())
    with pytest.raises(CannotSuspendError, match="MIG instance is not moved by jupyter-gpushare"):
        service.suspend("k1")
    assert not driver.calls and service.ledger.get("k1") is not None


async def test_an_mps_client_the_driver_refuses_says_so(tmp_path: Path, driver: FakeCheckpointDriver) -> None:
    service = make_service(tmp_path, when_full="queue", default_mode="mps")
    service.runner = InProcessRunner(driver)
    record = await service.acquire("k1", service.check("4G", "mps"))
    assert record.mode == "mps"
    service.attach_kernel("k1", os.getpid())
    service.ledger.report_usage("k1", GiB, None, "simulated")
    driver.fail["lock"] = Failure(NotSupported("cuCheckpointProcessLock: CUDA_ERROR_NOT_SUPPORTED", 801))
    with pytest.raises(CannotSuspendError, match=r"CUDA_ERROR_NOT_SUPPORTED\) \(an MPS client may not be"):
        service.suspend("k1")
    assert service.ledger.get("k1") is not None and driver.states.get(os.getpid(), "running") == "running"


async def test_a_kernel_that_suspends_itself_never_asks_nvml_while_it_is_checkpointed(
    tmp_path: Path, driver: FakeCheckpointDriver, fake_nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real driver blocks a checkpointed process's own NVML calls until its resume (an H200
    # hung there in nvmlInit): the kernel (here, this process) must not measure itself after.
    board = FakeBoard("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA L4", 24 * GiB)
    board.processes = [FakeProcess(os.getpid(), 2 * GiB)]
    fake_nvml([board])
    service = backend(tmp_path, driver, simulate="")
    await start(service, "k1", "8G")
    measured_while: list[str] = []
    measure = service.holding

    def holding(record: object) -> object:
        measured_while.append(driver.states.get(os.getpid(), "running"))
        return measure(record)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "holding", holding)
    outcome = service.suspend("k1")
    assert driver.states[os.getpid()] == "checkpointed" and outcome.state.state_bytes == 2 * GiB
    assert measured_while == ["running"]
    assert outcome.held_after.memory == 0 and service.ledger.get("k1") is None


async def test_a_server_suspending_another_process_measures_it_again_after_the_checkpoint(
    tmp_path: Path, driver: FakeCheckpointDriver, fake_nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        board = FakeBoard("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA L4", 24 * GiB)
        board.processes = [FakeProcess(child.pid, 2 * GiB)]
        fake_nvml([board])
        service = backend(tmp_path, driver, simulate="")
        await service.acquire("k1", service.check("8G", kernel_id="k1"))
        service.attach_kernel("k1", child.pid)
        measured_while: list[str] = []
        measure = service.holding

        def holding(record: object) -> object:
            measured_while.append(driver.states.get(child.pid, "running"))
            if measured_while[-1] == "checkpointed":
                board.processes = []  # what NVML shows of a checkpointed process: nothing
            return measure(record)  # type: ignore[arg-type]

        monkeypatch.setattr(service, "holding", holding)
        outcome = service.suspend("k1")
        assert measured_while == ["running", "checkpointed"]
        assert outcome.held_after.memory == 0 and outcome.held_after.source == "nvml"
    finally:
        child.kill()
        child.wait()
