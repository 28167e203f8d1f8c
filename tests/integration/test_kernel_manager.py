"""Real kernels through jupyter_client's AsyncMultiKernelManager on a simulated 80 GiB card."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from traitlets.config import Config

from jupyter_gpushare.core.errors import (
    DoesNotFitError,
    InvalidRequestError,
    ModeUnavailableError,
    QueueTimeoutError,
)
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS, GiB

from ..support.kernels import kernel_manager, run_cell, run_code, write_kernelspec
from ..support.nodes import Node
from ..support.polling import async_wait_until

pytestmark = pytest.mark.integration


def manager(**gpushare: object) -> AsyncMultiKernelManager:
    return kernel_manager(Config({"GPUShare": gpushare}) if gpushare else None)


async def test_third_kernel_queues_at_position_one_and_starts_when_one_ends(node: Node) -> None:
    kernels = manager()
    first = await kernels.start_kernel(kernel_name="python3-gpu-30g")
    second = await kernels.start_kernel(kernel_name="python3-gpu-30g")
    assert node.reserved() == 60 * GiB
    states: list[str] = []
    third = asyncio.create_task(
        kernels.start_kernel(kernel_name="python3-gpu-30g", gpushare_on_state=states.append)
    )
    try:
        await async_wait_until(lambda: len(node.queued()) == 1, message="the third kernel queued")
        waiting = node.queued()[0]
        assert node.ledger.queue_position(waiting.kernel_id) == 1
        # The start itself says it waits, and why: the ledger placed nothing for it.
        await async_wait_until(
            lambda: any("position 1" in state for state in states), message="its wait reported"
        )
        assert "30G does not fit: 20G free on GPU0" in states[-1]
        assert not third.done(), "a 30G kernel started while only 20G were free"
        assert node.reserved() == 60 * GiB

        await kernels.shutdown_kernel(first)
        third_id = await asyncio.wait_for(third, timeout=60)
        assert third_id == waiting.kernel_id
        assert {record.kernel_id for record in node.running()} == {second, third_id}
        assert node.reserved() == 60 * GiB
    finally:
        if not third.done():
            third.cancel()
        await kernels.shutdown_all()
    assert node.ledger.records() == []


async def test_when_full_fail_refuses_at_once_with_the_free_memory(node: Node) -> None:
    kernels = manager(when_full="fail")
    try:
        await kernels.start_kernel(kernel_name="python3-gpu-30g")
        await kernels.start_kernel(kernel_name="python3-gpu-30g")
        started = time.monotonic()
        with pytest.raises(DoesNotFitError, match="30G does not fit: 20G free on GPU0"):
            await kernels.start_kernel(kernel_name="python3-gpu-30g")
        assert time.monotonic() - started < 5
        assert len(node.running()) == 2 and node.queued() == []
        assert len(kernels.list_kernel_ids()) == 2
    finally:
        await kernels.shutdown_all()


async def test_a_queued_request_gives_up_after_queue_timeout(node: Node) -> None:
    kernels = manager(queue_timeout=1.0)
    try:
        await kernels.start_kernel(kernel_name="python3-gpu-30g")
        await kernels.start_kernel(kernel_name="python3-gpu-30g")
        with pytest.raises(QueueTimeoutError, match=r"after waiting 1 s.*20G free on GPU0"):
            await kernels.start_kernel(kernel_name="python3-gpu-30g")
        assert node.queued() == [] and len(node.running()) == 2
    finally:
        await kernels.shutdown_all()


async def test_the_kernel_sees_its_slice(node: Node) -> None:
    kernels = manager()
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-30g")
    try:
        record = node.ledger.get(kernel_id)
        assert record is not None and record.state == "running"
        output = await run_code(
            kernels.get_kernel(kernel_id),
            "import os\n"
            "for name in ('JUPYTER_GPUSHARE_MEMORY_BYTES', 'CUDA_VISIBLE_DEVICES', 'JUPYTER_GPUSHARE_MODE',"
            " 'XLA_PYTHON_CLIENT_MEM_FRACTION', 'XLA_PYTHON_CLIENT_PREALLOCATE', 'CUPY_GPU_MEMORY_LIMIT'):\n"
            "    print(name, os.environ.get(name))",
        )
        seen = dict(line.split(" ", 1) for line in output.strip().splitlines())
        assert seen["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(30 * GiB) == str(record.memory)
        assert seen["CUDA_VISIBLE_DEVICES"] == record.unit_uuid
        assert seen["CUDA_VISIBLE_DEVICES"] == node.ledger.devices()[0].uuid
        assert seen["JUPYTER_GPUSHARE_MODE"] == "timeslice"
        # The frameworks get the slice less the CUDA context allowance: (30G - 768M) / 80G
        assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3656"
        assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert seen["CUPY_GPU_MEMORY_LIMIT"] == str(30 * GiB - 768 * 2**20)
        kernel_process = node.ledger.get(kernel_id)
        assert kernel_process is not None and kernel_process.kernel is not None
        assert kernel_process.kernel.pid == kernels.get_kernel(kernel_id).provisioner.pid
    finally:
        await kernels.shutdown_all()
    assert node.ledger.records() == []


async def test_restart_keeps_the_slice_and_follows_the_new_process(node: Node) -> None:
    kernels = manager()
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    try:
        before = node.ledger.get(kernel_id)
        await kernels.restart_kernel(kernel_id, now=True)
        after = node.ledger.get(kernel_id)
        assert before is not None and after is not None
        assert (after.unit_uuid, after.memory, after.seq) == (before.unit_uuid, before.memory, before.seq)
        assert after.kernel is not None and before.kernel is not None
        assert after.kernel.pid != before.kernel.pid
        assert after.kernel.pid == kernels.get_kernel(kernel_id).provisioner.pid
    finally:
        await kernels.shutdown_all()
    assert node.ledger.records() == []


@pytest.mark.parametrize(
    ("bad_size", "said"),
    [
        ("abc", ACCEPTED_FORMS),
        ("-1G", "must be more than zero"),
        ("0", "must be more than zero"),
        ("10T", ACCEPTED_FORMS),
        ("%", ACCEPTED_FORMS),
        ("", ACCEPTED_FORMS),
    ],
)
async def test_bad_sizes_are_refused_with_what_is_wrong_and_reserve_nothing(
    node: Node, bad_size: str, said: str
) -> None:
    write_kernelspec(node, "bad-size", {"gpu_memory": bad_size, "gpu_mode": "timeslice"})
    kernels = manager()
    with pytest.raises(InvalidRequestError) as raised:
        await kernels.start_kernel(kernel_name="bad-size")
    assert said in str(raised.value)
    assert node.ledger.records() == []
    assert kernels.list_kernel_ids() == []


async def test_a_mode_the_node_cannot_honour_fails_with_what_is_missing(node: Node) -> None:
    write_kernelspec(node, "mig-4g", {"gpu_memory": "4G", "gpu_mode": "mig"})
    kernels = manager()
    with pytest.raises(ModeUnavailableError, match="needs MIG instances"):
        await kernels.start_kernel(kernel_name="mig-4g")
    assert node.ledger.records() == []


async def test_a_started_kernel_has_a_last_activity_before_the_server_watches_it(node: Node) -> None:
    # jupyter_server's GET /api/kernels lists a kernel once its start returns and formats its
    # last_activity, which the server itself sets only a loop turn later: a list in that gap
    # answered 500 (seen in full runs). The provisioner sets it at launch.
    server_kernels = "jupyter_server.services.kernels.kernelmanager.ServerKernelManager"
    kernels = kernel_manager(Config({"AsyncMultiKernelManager": {"kernel_manager_class": server_kernels}}))
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-30g")
        started = kernels.get_kernel(kernel_id)
        assert type(started).__name__ == "ServerKernelManager"
        assert started.last_activity is not None, "listed by the server with no last activity"
        assert started.last_activity.tzinfo is not None
    finally:
        await kernels.shutdown_all()


async def test_a_start_the_server_checked_is_not_checked_again_but_a_restart_is(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST kernels`` checks a start, then hands the checked request to the provisioner
    (``gpushare_checked``): one check per start. A restart checks again (its size may have
    changed). Before, the provisioner's ``pre_launch`` checked every start a second time."""
    from jupyter_gpushare.backends.local import LocalBackend, local_backend
    from jupyter_gpushare.config import load_settings

    checked: list[str] = []
    check = LocalBackend.check

    def counting_check(self: LocalBackend, *args: object, **kwargs: object) -> object:
        checked.append(str(kwargs.get("kernel_id", args[3] if len(args) > 3 else "")))
        return check(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalBackend, "check", counting_check)
    request = local_backend(load_settings(from_files=False, reconcile=False)).check("4G")
    checked.clear()
    kernels = manager()
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g", gpushare_checked=request)
        assert checked == [] and [record.memory for record in node.running()] == [4 * GiB]
        await kernels.restart_kernel(kernel_id)
        assert checked == [kernel_id]
        assert [record.kernel_id for record in node.running()] == [kernel_id]
    finally:
        await kernels.shutdown_all()


async def test_a_gpu_kernel_starts_without_debugpys_frozen_modules_warning(
    node: Node, tmp_path: Path
) -> None:
    """debugpy, which ipykernel imports at start, warns on CPython unless frozen modules are off;
    a terminal (``jupyter console``) shows it at the first prompt. The kernel echoes what it
    writes to its own stderr here (``quiet`` off), as a terminal shows it."""
    kernels = manager()
    with (tmp_path / "stderr").open("w+") as stderr:
        kernel_id = await kernels.start_kernel(
            kernel_name="python3-gpu-4g", stderr=stderr, extra_arguments=["--IPKernelApp.quiet=False"]
        )
        try:
            cell = await run_cell(
                kernels.get_kernel(kernel_id), "import sys; print('echoed', file=sys.stderr)"
            )
        finally:
            await kernels.shutdown_kernel(kernel_id, now=True)
        stderr.seek(0)
        said = stderr.read()
    assert cell.stderr == "echoed\n" and "echoed" in said, (cell, said)  # what the kernel writes is here
    assert "frozen modules" not in said, said
