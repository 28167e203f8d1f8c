"""The kernel acting on its own slice: what ``%gpu`` and ``jupyter_gpushare.kernel`` use.

A kernel proves who it is with the secret token its provisioner put in its environment
(``JUPYTER_GPUSHARE_TOKEN``), or, in a Kubernetes pod, in a file mounted from the kernel's Secret
(``JUPYTER_GPUSHARE_TOKEN_FILE``); the service compares it with the digest stored beside the slice
in the ledger, so a kernel can act on its own slice and on no other. Every change goes through
the same service API as the server and the CLI.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

from ..config import load_settings
from ..errors import GPUShareError, NotYourSliceError
from ..modes.base import SLICE_ENV_VARIABLES
from ..processes import current_process
from ..records import SliceRecord
from ..service import ENV_TOKEN, GPUShareService, service_for
from ..sizes import format_bytes, parse_size
from . import caps
from .pod import ENV_TOKEN_FILE, read_token_file

ENV_KERNEL_ID = "JUPYTER_GPUSHARE_KERNEL_ID"

T = TypeVar("T")


class NoSliceError(GPUShareError):
    """The kernel holds no slice for the operation to act on."""

    status = 404


class NeedsRestartError(GPUShareError):
    """The change needs a kernel restart and was not asked for with ``--restart``."""

    status = 409


def launch_kernel_ids() -> set[str]:
    """The ids this process may act under: those it was started with (the provisioner's
    ``JUPYTER_GPUSHARE_KERNEL_ID`` in its launch environment, its connection file's name) and
    ``process-<pid>``. Changing ``os.environ`` later does not change the launch environment."""
    ids = {f"process-{os.getpid()}"}
    try:
        launched = psutil.Process().environ()
    except (psutil.Error, OSError):
        launched = dict(os.environ)  # platforms where a process cannot read its own start
    if launched.get(ENV_KERNEL_ID):
        ids.add(launched[ENV_KERNEL_ID])
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
    """This kernel's slice."""

    def __init__(self, service: GPUShareService | None = None) -> None:
        # The provisioner handed this kernel its settings as JUPYTER_GPUSHARE_* variables; a
        # kernel reads no config files and leaves reconciling the node to the servers.
        self.service = service or service_for(load_settings(from_files=False, reconcile=False))
        self.kernel_id = (
            os.environ.get(ENV_KERNEL_ID) or _kernel_id_from_connection_file() or f"process-{os.getpid()}"
        )
        token = os.environ.get(ENV_TOKEN) or read_token_file(os.environ.get(ENV_TOKEN_FILE))
        if token:
            self.service.remember_token(self.kernel_id, token)
        self._token = token

    # ---- reading -------------------------------------------------------------------------

    def record(self) -> SliceRecord | None:
        return self.service.own_slice(self.kernel_id, self._token)

    def require(self) -> SliceRecord:
        record = self.record()
        if record is None:
            raise NoSliceError("this kernel holds no GPU slice; take one with %gpu request 4G")
        return record

    def device_label(self, record: SliceRecord) -> str:
        for device in self.service.ledger.devices():
            if device.uuid == record.device_uuid:
                return f"{device.label} ({device.name})"
        return record.device_uuid or "?"

    def free_on_device(self, record: SliceRecord) -> int | None:
        for device in self.service.pool()["devices"]:
            if device["uuid"] == record.device_uuid:
                capacity = int(device["memory_total"] * self.service.settings.overcommit)
                return max(0, capacity - int(device["memory_reserved"]))
        return None

    # ---- changing ------------------------------------------------------------------------

    def request(
        self,
        memory: object,
        mode: object = None,
        cores: object = None,
        on_wait: Callable[[int, str], None] | None = None,
    ) -> SliceRecord:
        """Take a new slice (waiting in the queue like a kernel start would)."""
        request = self.service.make_request(memory, mode, cores, self.kernel_id)
        current = self.record()
        if current is not None:
            raise GPUShareError(
                f"this kernel already holds a {format_bytes(current.memory)} slice on "
                f"{self.device_label(current)}; use %gpu resize or %gpu release first"
            )
        self.service.check_claim(self.kernel_id, self._token, current_process())
        if self.kernel_id not in launch_kernel_ids():
            raise NotYourSliceError(
                f"this process was not started as kernel {self.kernel_id}: a kernel takes a GPU "
                "slice under its own id only"
            )
        record: SliceRecord = _run_async(
            lambda: self.service.acquire(self.kernel_id, request, on_wait=on_wait)
        )
        self.service.attach_kernel(self.kernel_id, os.getpid())
        self._token = self.service.token_for(self.kernel_id)
        self._adopt(record)
        return record

    def resize(self, memory: object, restart: bool = False) -> tuple[SliceRecord, list[str]]:
        """Resize in place; returns the slice and what was done to apply it."""
        self.require()
        parse_size(memory)  # a bad size is refused before anything else is considered
        blocking = caps.imported_needing_restart()
        if blocking and not restart:
            names = ", ".join(blocking)
            raise NeedsRestartError(
                f"{names} read the memory cap only when they start: nothing was changed. "
                f"Run %gpu resize {memory} --restart to resize and restart the kernel"
            )
        record = self.service.resize(self.kernel_id, memory)
        self._adopt(record)
        notes = [f"{result.framework}: {result.detail}" for result in caps.reapply_imported()]
        if restart:
            notes.append("restarting the kernel so every framework starts with the new cap")
            # While no kernel process exists, the slice follows the process that started us.
            self.service.attach_kernel(self.kernel_id, None)
            _restart_soon()
        return record, notes

    def release(self) -> SliceRecord:
        record = self.require()
        self.service.release(self.kernel_id, keep_claim=True)
        for name in SLICE_ENV_VARIABLES - {ENV_TOKEN}:
            os.environ.pop(name, None)
        # New CUDA users in this process (or its children) must not think they have a GPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return record

    def report_usage(self, memory: object, utilization: int | None = None) -> None:
        """Declare this kernel's usage on a simulated pool (demos and tests drive the panel)."""
        self.require()
        if not self.service.inventory.simulated and not self.service.ledger.simulated():
            raise GPUShareError(
                "declared usage is for simulated pools; on real GPUs usage is measured by NVML"
            )
        used = parse_size(memory).resolve(0) if memory not in (0, "0") else 0
        if utilization is not None and not (isinstance(utilization, int) and 0 <= utilization <= 100):
            raise GPUShareError(f"utilization must be a whole percentage 0-100, not {utilization!r}")
        self.service.ledger.report_usage(self.kernel_id, used, utilization, "simulated")

    def _adopt(self, record: SliceRecord) -> None:
        """Make this process's environment describe ``record``, for what starts from now on."""
        os.environ.update(self.service.kernel_env(record))


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
