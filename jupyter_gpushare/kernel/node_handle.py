"""A local kernel's handle on its own slice, reaching it through its node's slices (one of the two
:class:`~.slice_handle.SliceHandle` implementations; the other is a pod's, :mod:`.pod_handle`).

A kernel proves who it is with the secret token its provisioner put in its environment
(``JUPYTER_GPUSHARE_TOKEN``); the backend compares it with the digest stored beside the slice in
the ledger, so a kernel can act on its own slice and on no other. Every change goes through the
same backend as the server and the CLI: the node ledger in the kernel's process, or — when the
provisioner handed it a broker's address — the GPU broker, and then the kernel opens no ledger. The
kernel reads the pool and checks requests through the service API (``backend``, a
:class:`~jupyter_gpushare.backends.protocol.Backend`) and acts on its slice through ``slices`` (a
:class:`~jupyter_gpushare.backends.protocol.NodeSlices`): two roles of that one backend.
Held memory, forced shrinks and suspend/resume need the node ledger itself (not yet a broker):
the backend's ``capabilities`` say so, and a broker refuses them with ``NotOfferedError``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import (
    CannotSuspendError,
    GPUShareError,
    NeedsRestartError,
    NoSliceError,
    NotOfferedError,
    NotYourSliceError,
)
from jupyter_gpushare.core.placement.holding import forced_note, released_note
from jupyter_gpushare.core.records import Holding, ReleasedSlice, SliceRecord, Suspension, UsageReport
from jupyter_gpushare.core.sizes import format_bytes, parse_size
from jupyter_gpushare.kernel import caps
from jupyter_gpushare.kernel.display import PoolStatus, SliceStatus, free_on

if TYPE_CHECKING:
    from jupyter_gpushare.backends.protocol import Backend, CellNotes, NodeSlices
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.kernel.activity import ActivityWatch

WaitCallback = Callable[[int, str], None]

log = logging.getLogger("jupyter_gpushare")


def launch_kernel_ids() -> set[str]:
    """The ids this process may act under: those it was started with (the provisioner's
    ``JUPYTER_GPUSHARE_KERNEL_ID`` in its launch environment, its connection file's name) and
    ``process-<pid>``. Changing ``os.environ`` later does not change the launch environment."""
    ids = {f"process-{os.getpid()}"}
    try:
        launched = psutil.Process().environ()
    except (psutil.Error, OSError):
        launched = dict(os.environ)  # platforms where a process cannot read its own start
    if launched.get(env_names.KERNEL_ID):
        ids.add(launched[env_names.KERNEL_ID])
    from_file = _kernel_id_from_connection_file()
    if from_file:
        ids.add(from_file)
    return ids


def _kernel_id_from_connection_file() -> str | None:
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # not inside an ipykernel
        return None
    match = re.match(r"kernel-(.+)\.json$", name)
    return match.group(1) if match else None


class NodeSliceHandle:
    """This kernel's slice, reached through its backend's kernel-facing calls (the ``NodeSlices``
    role: the node ledger, or the GPU broker that holds it)."""

    def __init__(self) -> None:
        self._settings: GPUShare | None = None
        self._backend: Backend | None = None
        self._slices: NodeSlices | None = None
        self.kernel_id = (
            os.environ.get(env_names.KERNEL_ID)
            or _kernel_id_from_connection_file()
            or f"process-{os.getpid()}"
        )
        self._token = os.environ.get(env_names.TOKEN)
        self._activity: ActivityWatch | None = None
        self._notes: CellNotes | None = None
        self._notes_found = False
        self._notes_lock = threading.Lock()

    @property
    def settings(self) -> GPUShare:
        """The provisioner handed this kernel its settings as JUPYTER_GPUSHARE_* variables; a
        kernel reads no config files and leaves reconciling the node to the servers."""
        if self._settings is None:
            self._settings = _kernel_settings()
        return self._settings

    @property
    def backend(self) -> Backend:
        """The kernel's backend as any front end sees it (the pool, checks, usage reports), built
        on first use (a kernel starts without it)."""
        if self._backend is None:
            from jupyter_gpushare.backends import backend_for

            self._backend = backend_for(self.settings)
        return self._backend

    @property
    def slices(self) -> NodeSlices:
        """The kernel's own slice as its backend holds it, built on first use."""
        if self._slices is None:
            from jupyter_gpushare.backends import node_slices_for

            self._slices = node_slices_for(self.settings)
            if self._token:
                self._slices.remember_token(self.kernel_id, self._token)
        return self._slices

    def _cell_notes(self) -> CellNotes | None:
        """Where the calls around every cell go: the backend once it is built, else what its kind
        answers them with at the least cost (no devices probed), found once."""
        if self._slices is not None:
            return self._slices
        with self._notes_lock:
            if not self._notes_found:
                from jupyter_gpushare.backends import cell_notes_for

                self._notes_found = True
                try:
                    self._notes = cell_notes_for(self.settings)
                except GPUShareError as error:  # cells run on; %gpu says what is wrong
                    log.warning("GPU: this kernel's cells are not noted: %s", error)
            return self._notes

    @property
    def sample_interval(self) -> float:
        return self.settings.sample_interval

    # ---- reading -------------------------------------------------------------------------

    def record(self) -> SliceRecord | None:
        return self.slices.own_slice(self.kernel_id, self._token)

    def require(self) -> SliceRecord:
        record = self.record()
        if record is None:
            raise NoSliceError("this kernel holds no GPU slice; take one with %gpu request 4G")
        return record

    def device_label(self, record: SliceRecord | ReleasedSlice, short: bool = False) -> str:
        for device in self.slices.devices():
            if device.uuid == record.device_uuid:
                return device.label if short else f"{device.label} ({device.name})"
        return record.device_uuid or "?"

    def released(self) -> ReleasedSlice | None:
        """What this kernel left counted when it released its slice (held memory, a suspended
        state): cheap before every cell."""
        notes = self._cell_notes()
        return notes.released(self.kernel_id) if notes is not None else None

    def warnings(self) -> tuple[str, ...]:
        """The warnings on this kernel's slice (cheap after every cell); none for a kernel no
        provisioner started, which has no slice to be warned about."""
        if not os.environ.get(env_names.KERNEL_ID):
            return ()
        notes = self._cell_notes()
        return notes.own_warnings(self.kernel_id, self._token) if notes is not None else ()

    def note_cell(self, busy: bool, at: float, idle_after: float) -> None:
        """Tell the accounting that a cell started (``busy``) or ended at ``at``, and what the
        idle timer does after ``idle_after`` seconds (called off the cell's thread)."""
        action = os.environ.get(env_names.IDLE_ACTION) or "suspend"
        notes = self._cell_notes()
        if notes is not None:
            notes.note_activity(self.kernel_id, self._token, busy, at, idle_after, action)

    def free_on_device(self, record: SliceRecord) -> int | None:
        """What no kernel has reserved on this kernel's device (its own slice counts as taken):
        "free" as the pool, the panel and a refusal say it."""
        pool = self.backend.pool()
        for device in pool["devices"]:
            if device["uuid"] == record.device_uuid:
                return free_on(dict(device), pool["overcommit"])
        return None

    def status(
        self, notes: list[str] | None = None, outcome: list[str] | None = None, ask_again: str | None = None
    ) -> SliceStatus:
        record = self.record()
        left = None if record is not None else self.released()
        where = record or (left if left is not None and left.device_uuid else None)
        return SliceStatus(
            kernel_id=self.kernel_id,
            record=record,
            released=left,
            device=self.device_label(where) if where else "",
            device_short=self.device_label(record, short=True) if record else "",
            free_on_device=self.free_on_device(record) if record else None,
            simulated=self.slices.simulated(),
            caps=caps.descriptions(),
            notes=list(notes or []),
            outcome=list(outcome or []),
            ask_again=ask_again or self.settings.default_memory,
        )

    def pool(self) -> PoolStatus:
        return PoolStatus(dict(self.backend.pool()))

    # ---- changing ------------------------------------------------------------------------

    def request(
        self,
        memory: object,
        mode: object = None,
        cores: object = None,
        on_wait: WaitCallback | None = None,
    ) -> SliceStatus:
        """Take a new slice (waiting in the queue like a kernel start would)."""
        self.take(memory, mode, cores, on_wait)
        return self.status(
            ["New slice taken. Frameworks that already use the GPU keep their device until restart."]
        )

    def take(
        self, memory: object, mode: object = None, cores: object = None, on_wait: WaitCallback | None = None
    ) -> SliceRecord:
        slices = self.slices
        request = self.backend.check(memory, mode, cores, self.kernel_id)
        current = self.record()
        if current is not None:
            raise GPUShareError(
                f"this kernel already holds a {format_bytes(current.memory)} slice on "
                f"{self.device_label(current)}; use %gpu resize or %gpu release first"
            )
        slices.check_claim(self.kernel_id, self._token, current_process())
        if self.kernel_id not in launch_kernel_ids():
            raise NotYourSliceError(
                f"this process was not started as kernel {self.kernel_id}: a kernel takes a GPU "
                "slice under its own id only"
            )
        record: SliceRecord = _run_async(lambda: slices.acquire(self.kernel_id, request, on_wait=on_wait))
        slices.attach_kernel(self.kernel_id, os.getpid())
        self._token = slices.token_for(self.kernel_id)
        self._adopt(record)
        return record

    def resize(self, memory: object, restart: bool = False, force: bool = False) -> SliceStatus:
        """Resize in place; JAX/TensorFlow read their cap only at start, so they need ``restart``.

        Frameworks' caches are freed first, then what the kernel holds is measured: a shrink
        below it is refused with the numbers, unless ``force`` (it then stays reserved).
        """
        self.require()
        parse_size(memory)  # a bad size is refused before anything else is considered
        blocking = caps.imported_needing_restart()
        if blocking and not restart:
            names = ", ".join(blocking)
            raise NeedsRestartError(
                f"{names} read the memory cap only when they start: nothing was changed. "
                f"Run %gpu resize {memory} --restart to resize and restart the kernel"
            )
        caps.free_caches()
        record = self.slices.resize(self.kernel_id, memory, force=force)
        self._adopt(record)
        notes = [f"{result.framework}: {result.detail}" for result in caps.reapply_imported()]
        if record.held_beyond:
            notes.append(forced_note(record.memory, record.held_beyond, self.device_label(record, True)))
        if restart:
            notes.append("restarting the kernel so every framework starts with the new cap")
            # While no kernel process exists, the slice follows the process that started us.
            self.slices.attach_kernel(self.kernel_id, None)
            _restart_soon()
        return self.status(notes)

    def release(self) -> SliceStatus:
        released, held = self.give_back()
        return self.status(outcome=[self._released_note(released, held)], ask_again=released.size)

    def _released_note(self, released: SliceRecord, held: Holding) -> str:
        return released_note(released.memory, held.memory, held.source, self.device_label(released, True))

    def give_back(self) -> tuple[SliceRecord, Holding]:
        """Release the slice once frameworks' caches are freed; what this kernel's processes
        still hold stays reserved. Returns what was released and what is held."""
        self.require()
        caps.free_caches()
        record, held = self.slices.give_back(self.kernel_id)
        self._forget_slice()
        return record, held

    def _forget_slice(self) -> None:
        for name in env_names.SLICE_VARIABLES - {env_names.TOKEN}:
            os.environ.pop(name, None)
        # New CUDA users in this process (or its children) must not think they have a GPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    # ---- suspend and resume ----------------------------------------------------------------

    def suspend(self) -> SliceStatus:
        """Suspend this kernel's GPU state; inside a cell, once the cell has ended (a CUDA call
        later in the same cell would otherwise wait for the resume)."""
        self.require()
        watch = self._activity
        if watch is not None and watch.running_cell:
            watch.after_cell(self._suspend_after_cell)
            return self.status(["This kernel suspends its GPU state when this cell ends."])
        return self.status(self._suspended_notes(self.suspend_now()))

    def _suspend_after_cell(self) -> None:
        try:
            notes = self._suspended_notes(self.suspend_now())
        except GPUShareError as error:
            print(f"%gpu suspend: {error}", file=sys.stderr)
            return
        print("\n".join(notes))

    def suspend_now(self) -> Suspension:
        self.backend.capabilities.require("can_suspend")  # before the caches are emptied
        caps.free_caches()
        outcome = self.slices.suspend(self.kernel_id)
        self._forget_slice()
        return outcome

    def _suspended_notes(self, outcome: Suspension) -> list[str]:
        state = outcome.state
        moved = (
            f"Suspended: {format_bytes(state.state_bytes)} of GPU state moved to host memory in "
            f"{outcome.seconds:.1f} s"
            if state.checkpointed
            else "Suspended (it held no GPU memory: nothing to move)"
        )
        notes = [
            f"{moved}; the {format_bytes(state.memory)} slice on {outcome.device.label} is back in the "
            "pool. The next cell (or %gpu resume) waits for a slice and restores it."
        ]
        if outcome.held_after.memory:
            notes.append(
                f"Its processes still hold {format_bytes(outcome.held_after.memory)} on "
                f"{outcome.device.label}: it stays reserved until freed."
            )
        return notes

    def resume(self, on_wait: WaitCallback | None = None) -> SliceStatus:
        """Wait for a slice like a start, restore the GPU state, and say where and how long."""
        return self.status([self._resume(on_wait)])

    def _resume(self, on_wait: WaitCallback | None) -> str:
        slices = self.slices
        outcome = _run_async(lambda: slices.resume(self.kernel_id, on_wait=on_wait))
        self._adopt(outcome.record)
        caps.reapply_imported()
        state = outcome.state
        if state.checkpointed:
            note = (
                f"Resuming your {format_bytes(state.state_bytes)} GPU state on {outcome.device.label} "
                f"({outcome.seconds:.1f} s)"
            )
        else:
            note = f"Took a {state.size} GPU slice again on {outcome.device.label} (there was no GPU state)"
        return note

    def before_cell(self, source: str) -> None:
        """A suspended kernel resumes before a cell runs — unless the cell is only ``%gpu``."""
        lines = [line.strip() for line in source.splitlines() if line.strip()]
        if all(line.startswith("%gpu") for line in lines):
            return
        left = self.released()
        if left is None or left.suspended is None:
            return

        def tell(position: int, reason: str) -> None:
            print(f"Waiting for a GPU slice: position {position} in the queue ({reason})", flush=True)

        print(self._resume(on_wait=tell), flush=True)

    def on_idle(self, idle_for: float) -> str | None:
        """The idle action (``GPUShare.idle_action``): suspend, or release; the notice."""
        try:
            record = self.record()
        except GPUShareError:
            return None
        if record is None or record.state != "running":
            return None
        why = ""
        if (os.environ.get(env_names.IDLE_ACTION) or "suspend") == "suspend":
            try:
                outcome = self.suspend_now()
            except CannotSuspendError as error:
                why = f" It could not be suspended: {error.why}."
            except NotOfferedError as error:  # a broker: released instead
                why = f" It could not be suspended: {error}."
            else:
                return (
                    f"This kernel was suspended after {idle_for:.0f} s idle (GPUShare.idle_action): "
                    + " ".join(self._suspended_notes(outcome))
                )
        released, held = self.give_back()
        return (
            f"Your {format_bytes(released.memory)} GPU slice was released after {idle_for:.0f} s "
            f"idle (GPUShare.idle_release_after).{why} Take one again with %gpu request "
            f"{released.size}. {self._released_note(released, held)}"
        )

    def declare_usage(self, memory: object, utilization: int | None = None) -> None:
        """Declare this kernel's usage on a simulated pool (demos and tests drive the panel).

        Without a slice, a kernel still holding memory declares what it holds now (it can only
        free it: without a slice it takes nothing new).
        """
        record = self.record()
        left = None if record is not None else self.released()
        if record is None and (left is None or left.held <= 0 or left.suspended is not None):
            self.require()  # says the kernel holds no slice
        if not self.slices.simulated():
            raise GPUShareError(
                "declared usage is for simulated pools; on real GPUs usage is measured by NVML"
            )
        used = parse_size(memory).resolve(0) if memory not in (0, "0") else 0
        if utilization is not None and not (isinstance(utilization, int) and 0 <= utilization <= 100):
            raise GPUShareError(f"utilization must be a whole percentage 0-100, not {utilization!r}")
        if record is None:
            assert left is not None
            if used > left.held:
                raise GPUShareError(
                    f"this kernel holds no GPU slice: it can declare at most the {format_bytes(left.held)} "
                    f"it still holds, not {format_bytes(used)}; take a slice with %gpu request"
                )
            self.slices.declare_held(self.kernel_id, used)
            return
        self.backend.report_usage(self.kernel_id, UsageReport(used, utilization, "simulated"))

    def watch(self, **kwargs: Any) -> Any:
        from jupyter_gpushare.kernel.widgets import SliceWatch

        return SliceWatch(self, **kwargs)

    def start(self, shell: Any) -> None:
        """Show new warnings after cells, and give the slice back after ``idle_release_after``."""
        from jupyter_gpushare.kernel.activity import ActivityWatch

        idle_after = float(os.environ.get(env_names.IDLE_RELEASE_AFTER) or 0)
        self._activity = ActivityWatch(self, idle_after)
        self._activity.register(shell)

    def _adopt(self, record: SliceRecord) -> None:
        """Make this process's environment describe ``record``, for what starts from now on."""
        os.environ.update(self.slices.kernel_env(record))


def _kernel_settings() -> GPUShare:
    from jupyter_gpushare.config import load_settings

    return load_settings(from_files=False, reconcile=False)


def _run_async(make: Callable[[], Any]) -> Any:
    """Run a coroutine to completion from code that may be inside the kernel's event loop."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(make())
        except BaseException as error:  # handed back to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name="gpushare-request")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _restart_soon() -> None:
    """End the kernel process once this cell's reply is out; the server's restarter brings it
    back with the slice it now holds. A front end without auto-restart just sees it stop."""

    def end() -> None:
        os._exit(0)

    threading.Timer(1.0, end).start()
