"""Held memory and suspend/resume in real gpushare kernels on a simulated pool.

The kernels, the ledger and the checkpoint helper process (``python -m
jupyter_gpushare.backends.local.checkpoint``) are real; the helper drives a simulated pool's driver,
which keeps each process's CUDA state as the real driver would. A kernel's GPU state there is what
it declared it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager

from jupyter_gpushare.core.sizes import GiB, format_bytes

from ..support.kernels import run_cell
from ..support.nodes import Node
from ..support.polling import async_wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
DECLARE = "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('{}')"


@pytest.fixture
async def kernels(node: Node) -> AsyncIterator[AsyncMultiKernelManager]:
    manager = AsyncMultiKernelManager()
    yield manager
    await manager.shutdown_all(now=True)


async def test_held_memory_is_refused_then_kept_reserved(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    kernel = kernels.get_kernel(kernel_id)
    await run_cell(kernel, DECLARE.format("3.8G"))
    refused = await run_cell(kernel, "%gpu resize 1G")
    assert refused.error is None and "1G is less than the 3.8G this kernel holds on GPU0" in refused.stderr
    assert node.ledger.get(kernel_id).memory == 4 * GiB  # type: ignore[union-attr]
    forced = await run_cell(kernel, "%gpu resize 1G --force")
    assert "Held: 3.8G" in forced.result and "keeps 3.8G reserved until it is freed" in forced.result, forced
    released = await run_cell(kernel, "%gpu release")
    assert "still holds 3.8G on GPU0" in released.result, released
    left = node.ledger.released(kernel_id)
    assert node.ledger.get(kernel_id) is None and left is not None and format_bytes(left.held) == "3.8G"


async def test_suspend_then_the_next_cell_waits_for_a_slice_resumes_and_runs(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    kernel = kernels.get_kernel(kernel_id)
    await run_cell(kernel, DECLARE.format("3.8G") + "\nx = 41")
    for line in ("%gpu resume", "%gpu suspend now", "%gpu resume --all"):
        cell = await run_cell(kernel, line)
        assert cell.error is None and cell.stderr, (line, cell)
    assert node.ledger.get(kernel_id).memory == 16 * GiB  # type: ignore[union-attr]

    suspended = await run_cell(kernel, "%gpu suspend")
    # A magic runs inside a cell: the kernel suspends once the cell has ended.
    assert "suspends its GPU state when this cell ends" in suspended.result, suspended
    assert "Suspended: 3.8G of GPU state moved to host memory" in suspended.stdout, suspended
    assert node.ledger.get(kernel_id) is None
    assert node.ledger.released(kernel_id).suspended is not None  # type: ignore[union-attr]
    status = await run_cell(kernel, "%gpu")
    assert "suspended" in status.result, status

    # The pool fills while it is suspended: the next cell waits in the queue, then resumes.
    other_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    other = kernels.get_kernel(other_id)
    await run_cell(other, "%gpu resize 70G")
    cell = asyncio.create_task(run_cell(kernel, "print(x + 1)"))
    await async_wait_until(lambda: node.ledger.get(kernel_id) is not None, timeout=30)
    assert node.ledger.get(kernel_id).state == "queued"  # type: ignore[union-attr]
    await run_cell(other, "%gpu release")
    done = await cell
    assert done.error is None, done
    out = done.stdout
    assert "Waiting for a GPU slice: position 1" in out
    assert "Resuming your 3.8G GPU state on GPU0" in out and out.strip().endswith("42"), out
    assert out.index("Resuming") < out.index("42")
    record = node.ledger.get(kernel_id)
    assert record is not None and record.state == "running" and record.memory == 16 * GiB
    assert record.memory_used is not None and format_bytes(record.memory_used) == "3.8G"


async def test_the_rest_routes_suspend_and_resume_and_refuse_bad_requests(node: Node) -> None:
    server: JupyterServer = await asyncio.to_thread(start_server, node)
    try:
        started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g"})
        kernel_id = started.body["kernel_id"]
        await execute(server, kernel_id, DECLARE.format("2G") + "\nx = 41")
        url = f"{API}/kernels/{kernel_id}"
        refusals = [
            ("POST", f"{url}/resume", None, 409, "not suspended"),
            ("POST", f"{url}/suspend", {"now": True}, 400, "takes no fields, not now"),
            ("POST", f"{API}/kernels/no-such-kernel/suspend", None, 404, "no-such-kernel"),
            ("PATCH", url, {"gpu_memory": "1G"}, 409, "1G is less than the 2G this kernel holds"),
            (
                "PATCH",
                url,
                {"gpu_memory": "1G", "force": "yes"},
                400,
                'force must be true or false, not "yes"',
            ),
        ]
        for method, path, body, status, words in refusals:
            answer = server.request(method, path, body)
            assert answer.status == status and words in answer.body["message"], (method, path, answer)
        assert node.ledger.get(kernel_id).memory == 4 * GiB  # type: ignore[union-attr]

        suspended = server.request("POST", f"{url}/suspend")
        assert suspended.status == 200 and suspended.body["state"] == "suspended", suspended
        left = node.ledger.released(kernel_id)
        assert node.ledger.get(kernel_id) is None and left is not None and left.suspended is not None
        again = server.request("POST", f"{url}/suspend")
        assert again.status == 409 and "suspended already" in again.body["message"]

        resumed = server.request("POST", f"{url}/resume")
        assert resumed.status == 200 and resumed.body["state"] == "running", resumed
        assert resumed.body["memory_request"] == 4 * GiB
        out, err = await execute(server, kernel_id, "print(x + 1)")
        assert out.strip() == "42" and "Resuming" not in out, (out, err)
    finally:
        await asyncio.to_thread(server.stop)
