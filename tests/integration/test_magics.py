"""``%gpu`` in real gpushare kernels: every change goes through the ledger, bad input changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager

from jupyter_gpushare.core.sizes import ACCEPTED_FORMS, GiB

from ..support.kernels import kernel_manager, run_cell
from ..support.nodes import Node
from ..support.polling import async_wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
async def kernels(node: Node) -> AsyncIterator[AsyncMultiKernelManager]:
    manager = kernel_manager()
    yield manager
    await manager.shutdown_all(now=True)


async def test_status_shows_the_slice(node: Node, kernels: AsyncMultiKernelManager) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    cell = await run_cell(kernels.get_kernel(kernel_id), "%gpu")
    assert "GPU slice: 16G (timeslice) on GPU0 (Simulated A100-80GB) — simulated pool" in cell.result
    # Free: what no kernel has reserved, this one's 16G counted as taken (as the pool says it).
    assert "Free on GPU0: 64G (reserved by no kernel)" in cell.result
    assert 'class="jp-gpushare-status"' in cell.html  # the rich view in a notebook
    # Nothing measured yet: no bar (a full one beside "not measured yet" said the opposite).
    assert "Used: not measured yet" in cell.result and 'title="used"' not in cell.html
    measured = await run_cell(
        kernels.get_kernel(kernel_id),
        "from jupyter_gpushare import kernel as gpu\n"
        "gpu.simulate_usage('4G')\n"
        "import time\n"
        "time.sleep(1.5)  # a sampling round\n"
        "gpu.status()",
    )
    assert "Used: 4G of 16G (25%)" in measured.result, measured
    assert 'title="used" style="width:25.0%' in measured.html


async def test_resize_changes_the_ledger(node: Node, kernels: AsyncMultiKernelManager) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    cell = await run_cell(kernels.get_kernel(kernel_id), "%gpu resize 8G")
    assert "GPU slice: 8G" in cell.result, cell
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 8 * GiB
    # The kernel's own environment follows, for frameworks imported from now on.
    seen = await run_cell(
        kernels.get_kernel(kernel_id), "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])"
    )
    assert seen.stdout.strip() == str(8 * GiB)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("-1G", "must be more than zero"),
        ("abc", "cannot read GPU size 'abc'"),
        ("1000G", "1000G is larger than any GPU in the pool (largest: 80G on GPU0)"),
    ],
)
async def test_bad_resizes_answer_clearly_and_change_nothing(
    node: Node, kernels: AsyncMultiKernelManager, size: str, message: str
) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    cell = await run_cell(kernels.get_kernel(kernel_id), f"%gpu resize {size}")
    assert cell.error is None, "a bad size is an answer, not a traceback"
    assert message in cell.stderr
    # The accepted forms follow only where the form was what is wrong.
    assert (ACCEPTED_FORMS in cell.stderr) is (size == "abc")
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 16 * GiB


async def test_a_resize_that_does_not_fit_says_how_much_is_free(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    mine = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    await kernels.start_kernel(kernel_name="python3-gpu-30g")
    cell = await run_cell(kernels.get_kernel(mine), "%gpu resize 60G")
    # One meaning of free (what no kernel has reserved: 80G less 16G and 30G), and what this
    # kernel could grow to, said apart.
    assert "60G does not fit: 34G free on GPU0, so this kernel can grow to 50G" in cell.stderr
    status = await run_cell(kernels.get_kernel(mine), "%gpu")
    assert "Free on GPU0: 34G" in status.result, status
    record = node.ledger.get(mine)
    assert record is not None and record.memory == 16 * GiB


async def test_release_frees_the_slice_and_request_takes_a_new_one(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    kernel = kernels.get_kernel(kernel_id)
    released = await run_cell(kernel, "%gpu release")
    # What was done first, then the state it left, asking again for the size it had.
    assert released.result.splitlines()[:2] == [
        "Released 16G.",
        "This kernel holds no GPU slice. Take one with %gpu request 16G.",
    ], released
    assert node.ledger.get(kernel_id) is None

    alive = await run_cell(kernel, "print(6 * 7)")
    assert alive.stdout.strip() == "42", "the kernel keeps running without a slice"

    taken = await run_cell(kernel, "%gpu request 2G")
    assert "GPU slice: 2G" in taken.result, taken
    record = node.ledger.get(kernel_id)
    assert record is not None and record.state == "running" and record.memory == 2 * GiB
    assert record.kernel is not None and record.kernel.pid == kernel.provisioner.pid  # type: ignore[union-attr]

    again = await run_cell(kernel, "%gpu request 4G")
    assert "already holds a 2G slice" in again.stderr

    # The slice taken from inside is still released when the kernel shuts down.
    await kernels.shutdown_kernel(kernel_id)
    assert node.ledger.records() == []


async def test_a_kernel_cannot_act_on_another_kernels_slice(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    mine = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    theirs = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    cell = await run_cell(
        kernels.get_kernel(mine),
        "import os\n"
        f"os.environ['JUPYTER_GPUSHARE_KERNEL_ID'] = '{theirs}'\n"
        "from jupyter_gpushare.kernel.node_handle import NodeSliceHandle\n"
        "NodeSliceHandle().release()",
    )
    assert cell.error == "NotYourSliceError"
    record = node.ledger.get(theirs)
    assert record is not None and record.memory == 4 * GiB


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("%gpu frobnicate", "%gpu: there is no command 'frobnicate'; the commands: status, pool,"),
        ("%gpu resize", "%gpu resize: the following arguments are required: size"),
        ("%gpu request 4G --cores many", "%gpu request: argument --cores: a whole number in the digits 0-9"),
        # Digits of another script, which int() reads: refused, as by every other door.
        ("%gpu request 4G --cores ٥٠", "%gpu request: argument --cores: a whole number in the digits 0-9"),
        ("%gpu request 4G --mode x", "%gpu request: argument --mode: invalid choice: 'x'"),
        ('%gpu resize "4G', "%gpu: No closing quotation"),
        # A space before the unit: the size, not a stray argument, is what is wrong.
        ("%gpu resize 4 G", "%gpu resize: GPU size '4 G' has a space inside; write 4G"),
        (
            "%gpu request 0.5 GiB --mode timeslice",
            "%gpu request: GPU size '0.5 GiB' has a space inside; write 0.5GiB",
        ),
    ],
)
async def test_a_mistyped_magic_says_what_is_wrong_in_one_line(
    node: Node, kernels: AsyncMultiKernelManager, line: str, said: str
) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    cell = await run_cell(kernels.get_kernel(kernel_id), line)
    assert cell.error is None and cell.stderr.startswith(said), cell
    assert len(cell.stderr.strip().splitlines()) == 1 and "%gpu help" in cell.stderr, cell
    help_text = await run_cell(kernels.get_kernel(kernel_id), "%gpu help")
    assert "%gpu resize SIZE" in help_text.stdout
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 4 * GiB


async def test_load_ext_in_a_plain_kernel(node: Node, kernels: AsyncMultiKernelManager) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3")
    kernel = kernels.get_kernel(kernel_id)
    status = await run_cell(kernel, "%load_ext jupyter_gpushare\n%gpu")
    assert "holds no GPU slice" in status.result, status
    taken = await run_cell(kernel, "%gpu request 2G")
    assert "GPU slice: 2G" in taken.result, taken
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 2 * GiB
    # A plain provisioner does not release it, but the slice follows the kernel process.
    await kernels.shutdown_kernel(kernel_id)
    node.ledger.reconcile()
    assert node.ledger.records() == []


async def test_watch_updates_live(node: Node, kernels: AsyncMultiKernelManager) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    kernel = kernels.get_kernel(kernel_id)
    shown = await run_cell(
        kernel, "from jupyter_gpushare import kernel as gpu\nw = gpu.watch(interval=0.1)\nw"
    )
    assert "VBox" in shown.result or shown.html or shown.result, shown
    cell = await run_cell(
        kernel,
        "import time\n"
        "gpu.simulate_usage('2G', 40)\n"
        "time.sleep(0.6)\n"
        "print(w.used.value, w.bar.value, w.bar.bar_style, 'polyline' in w.spark.value)",
    )
    assert cell.stdout.strip() == "2G of 4G (50%) 50.0 success True", cell


async def test_watch_in_a_front_end_without_widgets_is_text(
    node: Node, kernels: AsyncMultiKernelManager
) -> None:
    """``jupyter console`` shows an output's text/plain: the watch's is a readable view, while the
    widget itself still goes to a front end that shows widgets."""
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
    kernel = kernels.get_kernel(kernel_id)
    await run_cell(kernel, "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('1G', 30)")
    await async_wait_until(
        lambda: (record := node.ledger.get(kernel_id)) is not None and record.memory_used == GiB,
        message="the declared use in the ledger",
    )
    shown = await run_cell(kernel, "%gpu watch")
    assert shown.error is None, shown
    assert "application/vnd.jupyter.widget-view+json" in shown.mimetypes, shown
    assert shown.result.splitlines() == [
        "GPU slice 4G (timeslice) on GPU0 (Simulated A100-80GB)",
        "Used: 1G of 4G (25%), utilization 30%",
        "(a snapshot: the live view needs a front end that shows widgets, such as JupyterLab; "
        "%gpu status shows the slice again)",
    ], shown


async def test_resize_with_jax_imported_needs_restart(node: Node, kernels: AsyncMultiKernelManager) -> None:
    kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-16g")
    kernel = kernels.get_kernel(kernel_id)
    await run_cell(kernel, "import jax", timeout=120)

    refused = await run_cell(kernel, "%gpu resize 8G")
    assert "jax read the memory cap only when they start: nothing was changed" in refused.stderr
    assert "%gpu resize 8G --restart" in refused.stderr
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 16 * GiB

    old_pid = kernel.provisioner.pid  # type: ignore[union-attr]
    accepted = await run_cell(kernel, "%gpu resize 8G --restart")
    assert "restarting the kernel" in accepted.result
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 8 * GiB
    # The kernel ends itself; a server's restarter (here: an explicit restart) brings it back
    # with the resized slice in its environment.
    await async_wait_until(kernel.is_alive, 30, 0.1, "the kernel's end", until=lambda alive: not alive)
    await kernels.restart_kernel(kernel_id, now=True)
    assert kernel.provisioner.pid != old_pid  # type: ignore[union-attr]
    seen = await run_cell(kernel, "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])")
    assert seen.stdout.strip() == str(8 * GiB)
