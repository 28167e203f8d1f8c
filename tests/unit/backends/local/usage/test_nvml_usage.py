"""Usage measured through NVML: the snapshot, attribution through real process trees, the ledger.

Only ``pynvml`` is faked (``nvml_fake``); the kernels are real processes, the ledger a real sqlite
file. A "kernel" here is a python process with a ``sleep`` child, so the GPU memory NVML reports
for the child must reach the kernel's slice through its process tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.local.usage.attribution import ProcessUsage
from jupyter_gpushare.backends.local.usage.nvml_usage import read_snapshot
from jupyter_gpushare.backends.processes import identify, is_alive
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.records import ProcessIdentity, SliceRecord
from jupyter_gpushare.core.sizes import GiB, MiB
from tests.support.nvml_fake import (
    FakeBoard,
    FakeNVMLError,
    FakeNVMLState,
    FakeProcess,
    FakeProcessUtilization,
)
from tests.support.polling import wait_until

InstallNVML = Callable[..., FakeNVMLState]

KERNEL_SCRIPT = "import subprocess,time; p=subprocess.Popen(['sleep','60']); time.sleep(60)"
# A pid as NVML reports it from the host, meaning nothing in this pid namespace.
HOST_PID = 4_194_999


@pytest.fixture
def nvml(fake_nvml: InstallNVML, monkeypatch: pytest.MonkeyPatch) -> InstallNVML:
    """Install the fake ``pynvml``: the inventory's ``_nvml`` seam serves the sampler too."""

    def install(boards: Sequence[FakeBoard] = (), **options: Any) -> FakeNVMLState:
        return fake_nvml(boards, **options)

    return install


class KernelTree:
    """A real "kernel": a python process with one ``sleep`` child."""

    def __init__(self) -> None:
        self.root = subprocess.Popen([sys.executable, "-c", KERNEL_SCRIPT])
        self.child: psutil.Process | None = None
        try:
            children = wait_until(
                lambda: psutil.Process(self.root.pid).children(), 10, 0.02, "the kernel's child process"
            )
        except AssertionError:
            self.close()
            raise
        self.child = children[0]

    @property
    def pid(self) -> int:
        return self.root.pid

    @property
    def child_pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def identity(self) -> ProcessIdentity:
        identity = identify(self.root.pid)
        assert identity is not None
        return identity

    def close(self) -> None:
        # The child first, while its parent lives: then it is reaped with the tree and never
        # waits as an orphan. psutil checks the pid still names this very process.
        if self.child is not None:
            with contextlib.suppress(psutil.Error):
                self.child.kill()
        self.root.kill()
        self.root.wait()


@pytest.fixture
def kernel_trees() -> Iterator[Callable[[], KernelTree]]:
    started: list[KernelTree] = []

    def start() -> KernelTree:
        tree = KernelTree()
        started.append(tree)
        return tree

    try:
        yield start
    finally:
        for tree in started:
            tree.close()


def boards() -> list[FakeBoard]:
    return [
        FakeBoard("GPU-big", "NVIDIA A100-SXM4-80GB", 80 * GiB, memory_used=1 * GiB, utilization=3),
        FakeBoard("GPU-small", "NVIDIA L4", 24 * GiB, memory_used=0, utilization=0),
    ]


def nvml_service(tmp_path: Path, **settings: Any) -> LocalBackend:
    service = LocalBackend(GPUShare(ledger_path=str(tmp_path / "ledger.sqlite"), **settings))
    assert service.inventory.source == "nvml"  # the fake boards, not a simulated pool
    return service


async def start_kernel(service: LocalBackend, kernel_id: str, size: str, pid: int) -> SliceRecord:
    await service.acquire(kernel_id, service.check(size))
    service.attach_kernel(kernel_id, pid)
    record = service.ledger.get(kernel_id)
    assert record is not None and record.state == "running" and record.kernel is not None
    return record


def board_of(fakes: Sequence[FakeBoard], record: SliceRecord) -> FakeBoard:
    return next(board for board in fakes if board.uuid == record.device_uuid)


def stored(service: LocalBackend, kernel_id: str) -> SliceRecord:
    record = service.ledger.get(kernel_id)
    assert record is not None
    return record


def device_view(service: LocalBackend, uuid: str) -> dict[str, Any]:
    return next(device for device in service.pool()["devices"] if device["uuid"] == uuid)


# ---- read_snapshot ---------------------------------------------------------------------------


def test_snapshot_reads_only_the_devices_asked_for(nvml: InstallNVML) -> None:
    nvml(
        [
            FakeBoard("GPU-a", "A", 8 * GiB, memory_used=GiB, processes=[FakeProcess(7, GiB)]),
            FakeBoard("GPU-b", "B", 8 * GiB, memory_used=2 * GiB, processes=[FakeProcess(8, 2 * GiB)]),
        ]
    )
    snapshot = read_snapshot(["GPU-b"])
    assert snapshot.devices == {"GPU-b": (2 * GiB, 0)}
    assert snapshot.processes == {8: ProcessUsage(2 * GiB, None)}  # no utilisation sample


@pytest.mark.parametrize("order", [["GPU-a", "GPU-b"], ["GPU-b", "GPU-a"]])
def test_a_known_process_utilization_is_not_lost_to_another_device(
    nvml: InstallNVML, order: list[str]
) -> None:
    """A pid on two devices, measured on one: its utilisation must not depend on device order."""
    nvml(
        [
            FakeBoard(
                "GPU-a", "A", 8 * GiB, processes=[FakeProcess(101, GiB)],
                process_utilization=[FakeProcessUtilization(101, 30)],
            ),
            FakeBoard(
                "GPU-b", "B", 8 * GiB, processes=[FakeProcess(101, GiB)], process_utilization=None
            ),
        ]
    )  # fmt: skip
    snapshot = read_snapshot(order)
    assert snapshot.processes[101] == ProcessUsage(memory=2 * GiB, utilization=30)


def test_snapshot_shuts_nvml_down_when_a_device_is_gone(nvml: InstallNVML) -> None:
    state = nvml([FakeBoard("GPU-a", "A", 8 * GiB)])
    with pytest.raises(FakeNVMLError):
        read_snapshot(["GPU-a", "GPU-vanished"])
    assert (state.init_calls, state.shutdown_calls) == (1, 1)


# ---- the monitor on an NVML inventory -------------------------------------------------------


async def test_nvml_usage_of_a_kernels_child_reaches_its_slice(
    tmp_path: Path, nvml: InstallNVML, kernel_trees: Callable[[], KernelTree]
) -> None:
    fakes = boards()
    nvml(fakes)
    service = nvml_service(tmp_path)
    kernel, bystander = kernel_trees(), kernel_trees()
    record = await start_kernel(service, "k1", "4G", kernel.pid)
    await start_kernel(service, "k2", "4G", bystander.pid)
    board = board_of(fakes, record)
    # What the monitor writes must be NVML's numbers now, not what discovery read earlier.
    board.memory_used, board.utilization = 11 * GiB, 63
    unrelated = os.getpid()  # a real process in no kernel's tree (this test's own)
    board.processes = [
        FakeProcess(kernel.child_pid, 3 * GiB),
        FakeProcess(unrelated, 7 * GiB),
        FakeProcess(HOST_PID, 1 * GiB),
    ]
    board.process_utilization = [
        FakeProcessUtilization(kernel.child_pid, 37),
        FakeProcessUtilization(unrelated, 50),
    ]

    assert service.monitor.sample_once() == 2

    measured = stored(service, "k1")
    assert (measured.memory_used, measured.utilization, measured.usage_source) == (3 * GiB, 37, "nvml")
    assert measured.warnings == ()
    untouched = stored(service, "k2")  # its tree has no GPU process: the others are nobody's
    assert (untouched.memory_used, untouched.utilization, untouched.usage_source) == (None, None, None)
    device = device_view(service, board.uuid)
    assert (device["memory_used"], device["utilization"]) == (11 * GiB, 63)
    idle = next(other for other in fakes if other is not board)
    assert device_view(service, idle.uuid)["memory_used"] == idle.memory_used


async def test_a_kernels_own_report_is_kept_when_nvml_cannot_place_its_pids(
    tmp_path: Path, nvml: InstallNVML, kernel_trees: Callable[[], KernelTree]
) -> None:
    """In a container NVML reports host pids: the kernel's own report stands."""
    fakes = boards()
    nvml(fakes)
    service = nvml_service(tmp_path)
    kernel = kernel_trees()
    record = await start_kernel(service, "k1", "4G", kernel.pid)
    board = board_of(fakes, record)
    board.memory_used = 6 * GiB
    board.processes = [FakeProcess(HOST_PID, 6 * GiB)]  # the kernel's use, under a host pid
    board.process_utilization = [FakeProcessUtilization(HOST_PID, 80)]
    service.ledger.report_usage("k1", 1 * GiB, 12, source="kernel")

    service.monitor.sample_once()

    kept = stored(service, "k1")
    assert (kept.memory_used, kept.utilization, kept.usage_source) == (1 * GiB, 12, "kernel")
    assert kept.warnings == ()  # 1G of 4G: judged on the report, not on the host pid's 6G
    assert device_view(service, board.uuid)["memory_used"] == 6 * GiB


async def test_nvml_usage_that_ended_is_not_kept_as_current(
    tmp_path: Path, nvml: InstallNVML, kernel_trees: Callable[[], KernelTree]
) -> None:
    """Once NVML no longer lists the kernel's processes, its last NVML figure is not current."""
    fakes = boards()
    nvml(fakes)
    service = nvml_service(tmp_path, over_limit_action="warn")
    kernel = kernel_trees()
    record = await start_kernel(service, "k1", "4G", kernel.pid)
    board = board_of(fakes, record)
    board.processes = [FakeProcess(kernel.child_pid, 5 * GiB)]
    service.monitor.sample_once()
    over = stored(service, "k1")
    assert (over.memory_used, over.usage_source) == (5 * GiB, "nvml")
    assert "above its slice: using 5G of 4G (125%)" in over.warnings

    board.processes = []  # the child freed its GPU memory (its CUDA context ended)
    board.memory_used = 0
    service.monitor.sample_once()

    after = stored(service, "k1")
    assert not after.memory_used, after
    assert not any("above its slice" in warning for warning in after.warnings), after.warnings


async def test_over_limit_on_nvml_usage_kills_the_kernel(
    tmp_path: Path, nvml: InstallNVML, kernel_trees: Callable[[], KernelTree]
) -> None:
    fakes = boards()
    nvml(fakes)
    service = nvml_service(tmp_path, over_limit_action="kill", default_mode="timeslice")
    kernel = kernel_trees()
    try:
        record = await start_kernel(service, "k1", "4G", kernel.pid)
        assert record.mode == "timeslice"
        identity = kernel.identity()
        board_of(fakes, record).processes = [FakeProcess(kernel.child_pid, 5 * GiB)]

        service.monitor.sample_once()

        # The python process, root of the kernel's tree.
        wait_until(lambda: not is_alive(identity), 5, 0.02, "the end of the kernel's tree")
        killed = stored(service, "k1")
        assert (killed.memory_used, killed.usage_source) == (5 * GiB, "nvml")
        assert "above its slice: using 5G of 4G (125%)" in killed.warnings
        assert "over_limit_action=kill: the kernel was killed" in killed.warnings
    finally:
        kernel.close()


async def test_within_its_slice_the_kernel_is_not_killed(
    tmp_path: Path,
    nvml: InstallNVML,
    kernel_trees: Callable[[], KernelTree],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jupyter_gpushare")
    fakes = boards()
    nvml(fakes)
    service = nvml_service(tmp_path, over_limit_action="kill")
    kernel = kernel_trees()
    record = await start_kernel(service, "k1", "4G", kernel.pid)
    identity = kernel.identity()
    board_of(fakes, record).processes = [FakeProcess(kernel.child_pid, 3 * GiB)]
    service.monitor.sample_once()
    sampled = stored(service, "k1")
    assert sampled.memory_used == 3 * GiB
    # The round decides and acts before it returns, and says so where it acts: in the ledger
    # ("over_limit_action=kill: the kernel was killed") and in its log. Neither did it here.
    assert not any("above its slice" in w or "over_limit_action" in w for w in sampled.warnings)
    assert "over_limit_action" not in caplog.text
    assert is_alive(identity)


# ---- what each owner sees -------------------------------------------------------------------


async def test_kernels_view_shows_nvml_usage_and_own_warnings_only(
    tmp_path: Path, nvml: InstallNVML, kernel_trees: Callable[[], KernelTree]
) -> None:
    board = FakeBoard("GPU-one", "NVIDIA A100-SXM4-80GB", 80 * GiB, memory_used=20 * GiB, utilization=95)
    nvml([board])
    alice = nvml_service(tmp_path, owner="alice", over_limit_action="warn")
    bob = nvml_service(tmp_path, owner="bob", over_limit_action="warn")
    alices, bobs = kernel_trees(), kernel_trees()
    await start_kernel(alice, "alice-k", "4G", alices.pid)
    await start_kernel(bob, "bob-k", "4G", bobs.pid)
    board.processes = [
        FakeProcess(alices.child_pid, 3892 * MiB),
        FakeProcess(bobs.pid, 6 * GiB),  # the root of bob's tree: over his slice
    ]
    board.process_utilization = [
        FakeProcessUtilization(alices.child_pid, 35),
        FakeProcessUtilization(bobs.pid, 60),
    ]

    # Both services are this process, which holds both slices: one round samples both.
    assert alice.monitor.sample_once() == 2

    seen_by_alice = alice.all_kernels()
    own = next(entry for entry in seen_by_alice if entry["kernel_id"] == "alice-k")
    assert (own["memory_used"], own["utilization"], own["usage_source"]) == (
        3892 * MiB,
        35,
        "nvml",
    )
    assert own["warnings"] == [
        "near its slice: using 3.8G of 4G (95%)",
        "GPU0 is saturated (95% busy): this kernel 35%, 1 other kernel 60%",
    ]
    (theirs,) = [entry for entry in seen_by_alice if entry["kernel_id"] != "alice-k"]
    assert theirs["kernel_id"] is None and theirs["owner"] == "another user"
    assert theirs["warnings"] == []
    assert "bob" not in repr(theirs) and "above its slice" not in repr(theirs)

    # The warnings exist; only their owner sees them.
    bobs_own = next(entry for entry in bob.all_kernels() if entry["kernel_id"] == "bob-k")
    assert bobs_own["memory_used"] == 6 * GiB and bobs_own["usage_source"] == "nvml"
    assert "above its slice: using 6G of 4G (150%)" in bobs_own["warnings"]
    assert "over_limit_action=warn: nothing was stopped" in bobs_own["warnings"]
