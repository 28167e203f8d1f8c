"""Suspending a kernel's GPU state to host memory, and resuming it: the slice really given back.

Called through :class:`~.backend.LocalBackend` (``%gpu suspend``/``resume``, the idle timer, the
REST routes). A suspend measures what the kernel holds, checks it can be moved (one CUDA process,
room in host memory), has the driver checkpoint the kernel's process (:mod:`..checkpoint`), and
only once the driver reports it checkpointed gives the slice back, keeping what it needs to come
back. A resume waits for a slice through the FIFO queue like a start — on any card of the chip
the state came from, or that very card where the driver cannot remap — restores, and unlocks.
Whatever fails leaves the kernel as it was and says why: a failed suspend keeps its slice; a
failed resume stays suspended (its new slice goes back to the pool), unless the driver reports
the GPU state lost.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import psutil

from jupyter_gpushare.backends.local.checkpoint import Runner
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.devices import Device, Inventory
from jupyter_gpushare.core.errors import CannotSuspendError, DoesNotFitError, NoSliceError, ResumeError
from jupyter_gpushare.core.records import (
    Holding,
    ProcessIdentity,
    Resumption,
    SliceRecord,
    SuspendedState,
    Suspension,
)
from jupyter_gpushare.core.sizes import MiB, format_bytes
from jupyter_gpushare.core.slice_request import SliceRequest, make_slice_request

LOCK_TIMEOUT_MS = 10_000  # how long the driver waits for a kernel's submitted GPU work
HOST_MARGIN = 512 * MiB  # host memory left free beyond the GPU state itself

WaitCallback = Callable[[int, str], None]


class SuspendingNode(Protocol):
    """What suspend and resume need of the local backend."""

    settings: GPUShare
    ledger: Ledger
    inventory: Inventory
    runner: Runner

    def holding(self, record: SliceRecord) -> Holding: ...

    def acquire(
        self,
        kernel_id: str,
        request: SliceRequest,
        *,
        kernel_name: str = "",
        path: str = "",
        on_wait: WaitCallback | None = None,
        only_devices: Sequence[str] | None = None,
        token_hash: str | None = None,
        holder: ProcessIdentity | None = None,
    ) -> Coroutine[Any, Any, SliceRecord]: ...

    def attach_kernel(self, kernel_id: str, pid: int | None) -> None: ...


def _device(devices: Sequence[Device], uuid: str | None) -> Device | None:
    return next((device for device in devices if device.uuid == uuid), None)


def suspend(
    node: SuspendingNode, kernel_id: str, host_available: Callable[[], int] | None = None
) -> Suspension:
    """Checkpoint the kernel's GPU state to host memory, then give its slice back."""
    record = node.ledger.get(kernel_id)
    if record is None or record.state != "running":
        released = node.ledger.released(kernel_id)
        if released is not None and released.suspended is not None:
            raise NoSliceError("this kernel is suspended already; the next cell (or %gpu resume) resumes it")
        raise NoSliceError(f"kernel {kernel_id} holds no GPU slice to suspend")
    device = _device(node.ledger.devices(), record.device_uuid)
    assert device is not None and record.device_uuid is not None
    keeps = f"it keeps its {format_bytes(record.memory)} slice on {device.label}"

    def refuse(why: str) -> CannotSuspendError:
        return CannotSuspendError(f"this kernel cannot be suspended: {why}; {keeps}", why=why)

    if record.placement == "mig":
        raise refuse("the GPU state of a MIG instance is not moved by jupyter-gpushare (release it instead)")
    if record.kernel is None or not is_alive(record.kernel):
        raise refuse("its process is not running")
    pid = record.kernel.pid
    holding = node.holding(record)
    others = [other for other in holding.gpu_pids if other != pid]
    if others:
        pids = ", ".join(str(other) for other in holding.gpu_pids)
        raise refuse(
            f"{len(holding.gpu_pids)} of its processes use the GPU (pids {pids}) and a checkpoint "
            "moves one process: end the others (subprocesses, data loader workers) first"
        )
    checkpoint = holding.memory > 0 or bool(holding.gpu_pids)
    started = time.monotonic()
    if checkpoint:
        available = (host_available or _host_available)()
        needed = holding.memory + HOST_MARGIN
        if available < needed:
            raise refuse(
                f"its {format_bytes(holding.memory)} of GPU state does not fit in host memory: "
                f"{format_bytes(available)} available, {format_bytes(needed)} needed (with a "
                f"{format_bytes(HOST_MARGIN)} margin)"
            )
        result = node.runner.suspend(pid, LOCK_TIMEOUT_MS)
        if not result.ok:
            why = result.reason
            if result.unsupported and record.mode == "mps":
                why += " (an MPS client may not be checkpointed by this driver)"
            raise refuse(why)
    state = SuspendedState(
        size=record.size,
        mode=record.mode,
        placement=record.placement,
        cores=record.cores,
        memory=record.memory,
        device_uuid=record.device_uuid,
        device_name=device.name,
        state_bytes=holding.memory,
        suspended_at=time.time(),
        holder=record.holder,
        checkpointed=checkpoint,
    )
    # The driver blocks every call a checkpointed process makes into it, NVML's too, until the
    # resume (an H200 showed it: a kernel that suspended itself hung in nvmlInit), and NVML lists
    # no checkpointed process. Only another process (the server) may look again; a kernel that
    # suspended itself has the driver's word that nothing of it is left on the GPU.
    measurable = holding.source == "nvml" and not (checkpoint and pid == os.getpid())
    after = node.holding(record) if measurable else Holding(0, holding.source)
    # Only now, with the driver's word that nothing of it is on the GPU: the slice goes back.
    node.ledger.release(kernel_id, keep_claim=True, held=(after.memory, after.source), suspended=state)
    return Suspension(record, state, time.monotonic() - started, device, after)


def _host_available() -> int:
    return int(psutil.virtual_memory().available)


async def resume(node: SuspendingNode, kernel_id: str, on_wait: WaitCallback | None = None) -> Resumption:
    """Take a slice through the queue on a card the state can go to, restore, unlock."""
    released = node.ledger.released(kernel_id)
    if released is None or released.suspended is None:
        record = node.ledger.get(kernel_id)
        if record is not None and record.state == "running":
            raise NoSliceError(f"this kernel is not suspended: it holds its {record.size} slice")
        raise NoSliceError("this kernel is not suspended")
    state = released.suspended
    devices = node.ledger.devices()
    only: tuple[str, ...] | None = None
    if state.checkpointed:
        same_chip = [d for d in devices if d.name == state.device_name and not d.mig_enabled]
        if not await asyncio.to_thread(node.runner.can_remap):
            same_chip = [device for device in same_chip if device.uuid == state.device_uuid]
        if not same_chip:
            raise DoesNotFitError(
                f"no GPU of this pool can take the kernel's GPU state back: it came from a "
                f"{state.device_name} ({state.device_uuid})"
            )
        only = tuple(device.uuid for device in same_chip)
    settings = node.settings
    request = make_slice_request(
        state.size, state.mode, state.cores, settings.default_memory, settings.default_mode
    )
    holder = state.holder if is_alive(state.holder) else None
    try:
        record = await node.acquire(
            kernel_id,
            request,
            kernel_name=released.kernel_name,
            path=released.path,
            on_wait=on_wait,
            only_devices=only,
            token_hash=released.token_hash,
            holder=holder,
        )
    except BaseException:
        node.ledger.put_released(released)  # it is still suspended: its state waits in host memory
        raise
    node.attach_kernel(kernel_id, released.process.pid)
    device = _device(devices, record.device_uuid)
    assert device is not None
    started = time.monotonic()
    if state.checkpointed:
        pairs = remap_pairs(devices, state.device_uuid, device.uuid)
        result = await asyncio.to_thread(node.runner.resume, released.process.pid, pairs)
        if not result.ok:
            node.ledger.release(kernel_id, keep_claim=True, suspended=None if result.lost else state)
            if result.lost:
                raise ResumeError(
                    f"the kernel's GPU state is lost: {result.reason}. Restart the kernel to use a GPU again"
                )
            raise ResumeError(
                f"the kernel's GPU state could not be resumed on {device.label}: {result.reason}; it "
                "stays suspended and the slice went back to the pool"
            )
    if state.state_bytes and (node.inventory.simulated or node.ledger.simulated()):
        # A simulated pool: the declared use comes back with the state it stands for.
        node.ledger.report_usage(kernel_id, state.state_bytes, None, "simulated")
    return Resumption(record, state, time.monotonic() - started, device)


def remap_pairs(devices: Sequence[Device], old: str, new: str) -> tuple[tuple[str, str], ...]:
    """The driver's GPU pairs to restore a state from ``old`` onto ``new``: none when they are
    the same card; else every GPU of the node, the two swapped and the others onto themselves
    (the driver wants a pair for every GPU it sees)."""
    if old == new:
        return ()
    swapped = {old: new, new: old}
    return tuple((d.uuid, swapped.get(d.uuid, d.uuid)) for d in devices if not d.mig_enabled)
