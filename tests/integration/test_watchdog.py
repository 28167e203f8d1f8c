"""The over-limit watchdog, contention and idle release, on real kernels and a simulated pool.

A simulated kernel declares its usage (``jupyter_gpushare.kernel.simulate_usage``); the monitor
thread of the process that started it samples every 0.2 s, warns, and applies the action.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from traitlets.config import Config

from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.core.sizes import GiB

from ..support.kernels import kernel_manager, run_cell
from ..support.nodes import Node
from ..support.polling import async_wait_until

pytestmark = pytest.mark.integration

DECLARE_5G = "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('5G', 30)\n"


def manager(**gpushare: object) -> AsyncMultiKernelManager:
    return kernel_manager(Config({"GPUShare": {"sample_interval": 0.2, **gpushare}}))


def warnings_of(node: Node, kernel_id: str) -> tuple[str, ...]:
    record = node.ledger.get(kernel_id)
    return record.warnings if record else ()


async def test_warn_marks_the_kernel_and_keeps_it_running(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="jupyter_gpushare")
    kernels = manager(over_limit_action="warn")
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        await run_cell(kernel, "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('3.8G')")
        await async_wait_until(
            lambda: any("near its slice" in w for w in warnings_of(node, kernel_id)),
            15,
            0.1,
            "the near warning",
        )

        await run_cell(kernel, DECLARE_5G)
        await async_wait_until(
            lambda: any("above its slice" in w for w in warnings_of(node, kernel_id)),
            15,
            0.1,
            "the above warning",
        )
        status = await run_cell(kernel, "%gpu")
        assert "Warning: above its slice: using 5G of 4G (125%)" in status.result
        assert "over_limit_action=warn" in status.result
        assert "uses 5G of its 4G GPU slice (125%) on GPU0" in caplog.text
        assert (await run_cell(kernel, "print('still here')")).stdout.strip() == "still here"
        # The first cell to end after the warning appeared tells the user without being asked.
        assert "GPU warning: above its slice: using 5G of 4G (125%)" in status.stderr
    finally:
        await kernels.shutdown_all(now=True)


async def test_interrupt_stops_the_running_cell(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jupyter_gpushare")
    kernels = manager(over_limit_action="interrupt")
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        started = time.monotonic()
        cell = await run_cell(kernel, DECLARE_5G + "import time\ntime.sleep(30)")
        assert cell.error == "KeyboardInterrupt"
        assert time.monotonic() - started < 15
        assert "over_limit_action=interrupt" in caplog.text
        assert "uses 5G of its 4G GPU slice (125%)" in caplog.text
        # Interrupted, not killed: the kernel answers and still holds its slice.
        assert (await run_cell(kernel, "print(1)")).stdout.strip() == "1"
        assert node.ledger.get(kernel_id) is not None
    finally:
        await kernels.shutdown_all(now=True)


async def test_kill_ends_the_kernel(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jupyter_gpushare")
    kernels = manager(over_limit_action="kill")
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        record = node.ledger.get(kernel_id)
        assert record is not None and record.kernel is not None
        kernel_process = record.kernel
        running = asyncio.ensure_future(
            run_cell(kernel, DECLARE_5G + "import time\ntime.sleep(30)", timeout=40)
        )
        await async_wait_until(lambda: not is_alive(kernel_process), 15, 0.1, "the kernel killed")
        running.cancel()
        assert "over_limit_action=kill" in caplog.text
        assert "uses 5G of its 4G GPU slice (125%)" in caplog.text
        # A killed kernel's slice is released at the next reconciliation.
        node.ledger.reconcile()
        assert node.ledger.get(kernel_id) is None
    finally:
        await kernels.shutdown_all(now=True)


async def test_saturated_device_tells_each_kernel_its_share(node: Node) -> None:
    kernels = manager()
    try:
        first = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        second = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        code = "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('1G', {})"
        await run_cell(kernels.get_kernel(first), code.format(60))
        await run_cell(kernels.get_kernel(second), code.format(35))
        expected = "GPU0 is saturated (95% busy): this kernel 60%, 1 other kernel 35%"
        await async_wait_until(
            lambda: expected in warnings_of(node, first), 15, 0.1, "the saturation warning"
        )
        assert "GPU0 is saturated (95% busy): this kernel 35%, 1 other kernel 60%" in warnings_of(
            node, second
        )
    finally:
        await kernels.shutdown_all(now=True)


async def test_overcommitted_device_near_full_warns(node: Node) -> None:
    kernels = manager(overcommit=1.5)
    try:
        first = await kernels.start_kernel(kernel_name="python3-gpu-30g")
        second = await kernels.start_kernel(kernel_name="python3-gpu-30g")
        third = await kernels.start_kernel(kernel_name="python3-gpu-30g")  # 90G reserved on 80G
        code = "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('25G')"
        for kernel_id in (first, second, third):
            await run_cell(kernels.get_kernel(kernel_id), code)
        await async_wait_until(
            lambda: any(
                "GPU0 memory is 94% used while reservations are overcommitted (1.5x)" in w
                for w in warnings_of(node, third)
            ),
            15,
            0.1,
            "the overcommit warning",
        )
    finally:
        await kernels.shutdown_all(now=True)


async def test_idle_release_frees_the_slice_and_says_why(node: Node) -> None:
    kernels = manager(idle_release_after=1.0, idle_action="release")
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        await run_cell(kernel, "x = 1\nfrom jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('2G')")
        await async_wait_until(lambda: node.ledger.get(kernel_id) is None, 10, 0.1, "the idle release")
        # What its process still holds stays reserved.
        left = node.ledger.released(kernel_id)
        assert left is not None and left.held == 2 * GiB and left.suspended is None
        cell = await run_cell(kernel, "print(x)")
        assert cell.stdout.strip() == "1"
        assert "GPU slice was released after" in cell.stderr
        assert "idle" in cell.stderr and "%gpu request 4G" in cell.stderr
        assert "still holds 2G on GPU0" in cell.stderr
    finally:
        await kernels.shutdown_all(now=True)


async def test_idle_suspend_gives_everything_back_and_the_next_cell_resumes(node: Node) -> None:
    kernels = manager(idle_release_after=1.0)  # idle_action = "suspend", the default
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        await run_cell(kernel, "x = 1\nfrom jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('2G')")
        await async_wait_until(lambda: node.ledger.get(kernel_id) is None, 10, 0.1, "the idle suspend")
        left = node.ledger.released(kernel_id)
        assert left is not None and left.held == 0 and left.suspended is not None
        assert left.suspended.state_bytes == 2 * GiB
        cell = await run_cell(kernel, "print(x)")
        assert "was suspended after" in cell.stderr and "GPUShare.idle_action" in cell.stderr, cell
        assert cell.stdout.startswith("Resuming your 2G GPU state on GPU0") and cell.stdout.endswith("1\n"), (
            cell
        )
        record = node.ledger.get(kernel_id)
        assert record is not None and record.state == "running"
    finally:
        await kernels.shutdown_all(now=True)
