"""A local kernel acting on its own slice (one of the two ``MySlice`` kinds).

A kernel proves who it is with the secret token its provisioner put in its environment
(``JUPYTER_GPUSHARE_TOKEN``); the backend compares it with the digest stored beside the slice in
the ledger, so a kernel can act on its own slice and on no other. Every change goes through the
same backend as the server and the CLI: the node ledger in the kernel's process, or — when the
provisioner handed it a broker's address — the GPU broker, and then the kernel opens no ledger.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from .. import env_names
from ..errors import GPUShareError, NeedsRestartError, NoSliceError, NotYourSliceError
from ..processes import current_process
from ..records import SliceRecord, UsageReport
from ..sizes import format_bytes, parse_size
from . import caps
from .display import PoolStatus, SliceStatus

if TYPE_CHECKING:
    from ..backends import NodeSlices

WaitCallback = Callable[[int, str], None]


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


class OwnSlice:
    """This kernel's slice in the node ledger."""

    def __init__(self, backend: NodeSlices | None = None) -> None:
        self._backend = backend
        self.kernel_id = (
            os.environ.get(env_names.KERNEL_ID)
            or _kernel_id_from_connection_file()
            or f"process-{os.getpid()}"
        )
        self._token = os.environ.get(env_names.TOKEN)

    @property
    def backend(self) -> NodeSlices:
        """The node's slices, reached on first use (a kernel starts without opening anything).

        The provisioner handed this kernel its settings as JUPYTER_GPUSHARE_* variables; a
        kernel reads no config files and leaves reconciling the node to the servers.
        """
        if self._backend is None:
            from ..backends import node_slices_for
            from ..config import load_settings

            self._backend = node_slices_for(load_settings(from_files=False, reconcile=False))
            if self._token:
                self._backend.remember_token(self.kernel_id, self._token)
        return self._backend

    @property
    def sample_interval(self) -> float:
        return self.backend.settings.sample_interval

    # ---- reading -------------------------------------------------------------------------

    def record(self) -> SliceRecord | None:
        return self.backend.own_slice(self.kernel_id, self._token)

    def require(self) -> SliceRecord:
        record = self.record()
        if record is None:
            raise NoSliceError("this kernel holds no GPU slice; take one with %gpu request 4G")
        return record

    def device_label(self, record: SliceRecord) -> str:
        for device in self.backend.devices():
            if device.uuid == record.device_uuid:
                return f"{device.label} ({device.name})"
        return record.device_uuid or "?"

    def free_on_device(self, record: SliceRecord) -> int | None:
        pool = self.backend.pool()
        for device in pool["devices"]:
            if device["uuid"] == record.device_uuid:
                capacity = int(device["memory_total"] * pool["overcommit"])
                return max(0, capacity - int(device["memory_reserved"]))
        return None

    def status(self, notes: list[str] | None = None) -> SliceStatus:
        record = self.record()
        backend = self.backend
        return SliceStatus(
            kernel_id=self.kernel_id,
            record=record,
            device=self.device_label(record) if record else "",
            free_on_device=self.free_on_device(record) if record else None,
            simulated=backend.simulated(),
            caps=caps.descriptions(),
            notes=list(notes or []),
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
        backend = self.backend
        request = backend.check(memory, mode, cores, self.kernel_id)
        current = self.record()
        if current is not None:
            raise GPUShareError(
                f"this kernel already holds a {format_bytes(current.memory)} slice on "
                f"{self.device_label(current)}; use %gpu resize or %gpu release first"
            )
        backend.check_claim(self.kernel_id, self._token, current_process())
        if self.kernel_id not in launch_kernel_ids():
            raise NotYourSliceError(
                f"this process was not started as kernel {self.kernel_id}: a kernel takes a GPU "
                "slice under its own id only"
            )
        record: SliceRecord = _run_async(lambda: backend.acquire(self.kernel_id, request, on_wait=on_wait))
        backend.attach_kernel(self.kernel_id, os.getpid())
        self._token = backend.token_for(self.kernel_id)
        self._adopt(record)
        return record

    def resize(self, memory: object, restart: bool = False) -> SliceStatus:
        """Resize in place; JAX/TensorFlow read their cap only at start, so they need ``restart``."""
        self.require()
        parse_size(memory)  # a bad size is refused before anything else is considered
        blocking = caps.imported_needing_restart()
        if blocking and not restart:
            names = ", ".join(blocking)
            raise NeedsRestartError(
                f"{names} read the memory cap only when they start: nothing was changed. "
                f"Run %gpu resize {memory} --restart to resize and restart the kernel"
            )
        record = self.backend.resize(self.kernel_id, memory)
        self._adopt(record)
        notes = [f"{result.framework}: {result.detail}" for result in caps.reapply_imported()]
        if restart:
            notes.append("restarting the kernel so every framework starts with the new cap")
            # While no kernel process exists, the slice follows the process that started us.
            self.backend.attach_kernel(self.kernel_id, None)
            _restart_soon()
        return self.status(notes)

    def release(self) -> SliceStatus:
        released = self.give_back()
        return self.status(
            [
                f"Released {format_bytes(released.memory)}. Memory a framework already holds stays in "
                "use until you free it (e.g. torch.cuda.empty_cache()) or restart the kernel."
            ]
        )

    def give_back(self) -> SliceRecord:
        """Release the slice; returns what it was (the idle timer says so to the user)."""
        record = self.require()
        self.backend.free(self.kernel_id, keep_claim=True)
        for name in env_names.SLICE_VARIABLES - {env_names.TOKEN}:
            os.environ.pop(name, None)
        # New CUDA users in this process (or its children) must not think they have a GPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return record

    def declare_usage(self, memory: object, utilization: int | None = None) -> None:
        """Declare this kernel's usage on a simulated pool (demos and tests drive the panel)."""
        self.require()
        backend = self.backend
        if not backend.simulated():
            raise GPUShareError(
                "declared usage is for simulated pools; on real GPUs usage is measured by NVML"
            )
        used = parse_size(memory).resolve(0) if memory not in (0, "0") else 0
        if utilization is not None and not (isinstance(utilization, int) and 0 <= utilization <= 100):
            raise GPUShareError(f"utilization must be a whole percentage 0-100, not {utilization!r}")
        backend.report_usage(self.kernel_id, UsageReport(used, utilization, "simulated"))

    def watch(self, **kwargs: Any) -> Any:
        from .widgets import SliceWatch

        return SliceWatch(self, **kwargs)

    def start(self, shell: Any) -> None:
        """Show new warnings after cells, and give the slice back after ``idle_release_after``."""
        from .activity import ActivityWatch

        idle_after = float(os.environ.get(env_names.IDLE_RELEASE_AFTER) or 0)
        ActivityWatch(self, idle_after).register(shell)

    def _adopt(self, record: SliceRecord) -> None:
        """Make this process's environment describe ``record``, for what starts from now on."""
        os.environ.update(self.backend.kernel_env(record))


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
