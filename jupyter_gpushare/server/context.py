"""What the handlers share: the backend, this server's kernels and starts, the stream, caches.

The rules of the REST API live here, below the handlers and above the backend: what a start
through ``POST kernels`` does, when a release withdraws a start instead, how a resize is applied.
The backend answers everything about the pool and never tells the server which backend it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tornado import web

from jupyter_gpushare.backends import Backend, ServerKernels
from jupyter_gpushare.backends.provisioning import SliceProvisioner
from jupyter_gpushare.compat import forget_pending_kernel
from jupyter_gpushare.core.errors import (
    BackendUnavailableError,
    CannotSuspendError,
    DoesNotFitError,
    NoSliceError,
    NoSuchKernelError,
    NotYourSliceError,
)
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, StatusPayload
from jupyter_gpushare.core.placement.preview import Preview
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.server.kernelspecs import default_kernelspec, request_defaults
from jupyter_gpushare.server.openapi_document import served_document
from jupyter_gpushare.server.snapshots import Snapshots
from jupyter_gpushare.server.starts import Start, Starts
from jupyter_gpushare.server.stream import StreamHub

START_ANSWER_WITHIN = 1.0  # seconds POST kernels waits before answering "queued"
START_WAIT_LIMIT = 120.0  # seconds POST waits for a placed kernel's process to come up
WITHDRAWN_WITHIN = 5.0  # seconds DELETE kernels/{id}/gpu waits for a cancelled start to withdraw


@dataclass
class GPUShareContext:
    backend: Backend
    kernel_manager: Any
    kernel_spec_manager: Any
    starts: Starts = field(default_factory=Starts)
    hub: StreamHub = field(init=False)
    snapshots: Snapshots = field(init=False)
    # (kernelspec, notebook path) of kernels started through POST kernels
    started_as: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The kernels no session refers to and no client uses, each with what GET kernels says of
    # it (given by server.lifecycle's Reclaimer).
    unused: Callable[[], dict[str, str]] = field(default=dict)

    def __post_init__(self) -> None:
        self.snapshots = Snapshots(
            self._backend_marker,
            self._own_kernels,
            self.pool,
            self.server_kernels,
            lambda: self.backend.change_marker_at_once(),
        )
        self.hub = StreamHub(self.stream_event, lambda: self.backend.settings.sample_interval)

    # ---- this server's kernels -----------------------------------------------------------

    def own_kernel_ids(self) -> set[str]:
        return set(self.kernel_manager.list_kernel_ids()) | {s.kernel_id for s in self.starts.pending()}

    def require_own(self, kernel_id: str) -> None:
        if kernel_id not in self.own_kernel_ids():
            raise NoSuchKernelError(f"no kernel {kernel_id} on this server")

    def provisioner_of(self, kernel_id: str) -> SliceProvisioner | None:
        """The gpushare provisioner of one of this server's kernels (None for any other)."""
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except (KeyError, web.HTTPError):
            return None
        provisioner = getattr(kernel, "provisioner", None)
        return provisioner if isinstance(provisioner, SliceProvisioner) else None

    def known(self) -> ServerKernels:
        """What this server knows of its kernels, for the backend to describe them."""
        ids = self.own_kernel_ids()
        gpushare, starting, ended = set(), set(), set()
        names: dict[str, tuple[str, str]] = {}
        details: dict[str, str] = {}
        warnings: dict[str, tuple[str, ...]] = {}
        for kernel_id in ids:
            start = self.starts.get(kernel_id)
            provisioner = self.provisioner_of(kernel_id)
            if start is not None and start.pending:
                starting.add(kernel_id)
                gpushare.add(kernel_id)
            if provisioner is not None:
                gpushare.add(kernel_id)
                if provisioner.ended_reason and not provisioner.has_process:
                    ended.add(kernel_id)
                said: tuple[str, ...] = ()
                if provisioner.restarted_after:  # until the next restart or shutdown
                    said += (
                        f"the kernel was restarted after it ended: {provisioner.restarted_after}; "
                        "its variables are gone",
                    )
                if provisioner.resize_failure:  # until the next resize: why it kept its old size
                    said += (f"{provisioner.resize_failure}; the kernel kept its previous size",)
                if said:
                    warnings[kernel_id] = said
            detail = (start.detail if start is not None else None) or (
                provisioner.state if provisioner else ""
            )
            if detail:
                details[kernel_id] = detail
            names[kernel_id] = self._name_of(kernel_id, start)
        for kernel_id, warning in self.unused().items():
            if kernel_id in ids:
                warnings[kernel_id] = (*warnings.get(kernel_id, ()), warning)
        return ServerKernels(
            ids=frozenset(ids),
            gpushare=frozenset(gpushare),
            starting=frozenset(starting),
            ended=frozenset(ended),
            names=names,
            details=details,
            warnings=warnings,
        )

    def name_of(self, kernel_id: str) -> tuple[str, str]:
        """(kernelspec, notebook path) of one of this server's kernels, where known."""
        return self._name_of(kernel_id, self.starts.get(kernel_id))

    def _name_of(self, kernel_id: str, start: Start | None) -> tuple[str, str]:
        if start is not None:
            return (start.kernel_name, start.path)
        if kernel_id in self.started_as:
            return self.started_as[kernel_id]
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except (KeyError, web.HTTPError):
            return ("", "")
        return (str(getattr(kernel, "kernel_name", "")), "")

    def server_kernels(self) -> list[KernelPayload]:
        """``GET kernels``: this server's kernels, queued, running and without a slice; those no
        session refers to and no client uses are marked ``unused``."""
        views = self.backend.kernels(self.known())
        unused = self.unused()
        for view in views:
            if view["kernel_id"] in unused:
                view["unused"] = True
            view["capabilities"] = self.backend.capabilities.payload()
        return views

    def kernel_view(self, kernel_id: str) -> KernelPayload:
        """``GET kernels/{id}``; the client asking after a start still wants it."""
        self.starts.asked(kernel_id)
        start = self.starts.get(kernel_id)
        if start is not None and start.error is not None:
            raise start.error
        for view in self.server_kernels():
            if view["kernel_id"] == kernel_id:
                return view
        raise NoSuchKernelError(f"no GPU kernel {kernel_id} on this server")

    # ---- changes -------------------------------------------------------------------------

    async def start_kernel(
        self, name: str | None, path: str, fields: dict[str, Any]
    ) -> tuple[KernelPayload, bool]:
        """Start a kernel of gpushare kernelspec ``name`` whose slice fields ``fields`` override;
        its view, and whether it runs already (False: it waits for its slice)."""
        name = name or default_kernelspec(self.kernel_spec_manager, self.kernel_manager)
        merged = {**request_defaults(self.kernel_spec_manager, name), **fields}
        kernel_id = str(uuid.uuid4())
        # Checked before anything starts, and only here: a bad size, an impossible mode or a quota
        # the user has reached reserves nothing and starts nothing; the provisioner takes the
        # checked request (gpushare_checked) instead of checking it again.
        checked = await asyncio.to_thread(
            self.backend.check,
            merged.get("gpu_memory"),
            merged.get("gpu_mode"),
            merged.get("gpu_cores"),
            kernel_id,
        )
        self.started_as[kernel_id] = (name, path)
        loop = asyncio.get_running_loop()

        def noted(state: str) -> None:  # a provisioner may report from a worker thread
            loop.call_soon_threadsafe(self.starts.note, kernel_id, state)

        task = asyncio.ensure_future(
            self.kernel_manager.start_kernel(
                kernel_id=kernel_id,
                kernel_name=name,
                path=path or None,
                gpushare_path=path,
                # What the start is doing (queue position, the pod's phase and the scheduler's
                # words), as it comes, for GET kernels and the panel.
                gpushare_on_state=noted,
                gpushare_checked=checked,
                **fields,
            )
        )
        start = Start(kernel_id, name, path, task)
        self.starts.track(start, on_failure=self._forget_failed_start)
        started = await self._wait_for_start(start)
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return await asyncio.to_thread(self.kernel_view, kernel_id), started

    def forget_start(self, kernel_id: str) -> None:
        """A start that ended without a kernel (withdrawn while the server stops)."""
        self.starts.forget(kernel_id)
        self._forget_failed_start(kernel_id)

    def _forget_failed_start(self, kernel_id: str) -> None:
        self.started_as.pop(kernel_id, None)
        forget_pending_kernel(self.kernel_manager, kernel_id)

    async def _wait_for_start(self, start: Start) -> bool:
        """True once the kernel runs; False while it still waits for its slice after
        ``START_ANSWER_WITHIN`` seconds (or its placed process is not up after the limit).

        One wait, no loop of its own over the provisioner's: on the start's task, and after the
        first second on the provisioner's next report too (``Start.changed``: a queue position,
        a pod's phase); only then is the backend asked whether the start waits for its slice.
        """
        task = start.task
        await asyncio.wait([task], timeout=START_ANSWER_WITHIN)
        limit = time.monotonic() + START_WAIT_LIMIT
        while not task.done():
            start.changed.clear()  # before asking: a report while the backend answers counts
            if await asyncio.to_thread(self.backend.is_waiting, start.kernel_id):
                return False
            reported = asyncio.ensure_future(start.changed.wait())
            try:
                await asyncio.wait(
                    [task, reported],
                    timeout=max(0.0, limit - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                reported.cancel()
            if not task.done() and not start.changed.is_set():
                return False  # the limit: answer, the start goes on
        return task.exception() is None

    def cancel_start(self, kernel_id: str) -> None:
        """Cancel a queued start; its request leaves the queue and the kernel never starts."""
        start = self.starts.get(kernel_id)
        if start is not None and start.pending:
            start.task.cancel()
        self.starts.forget(kernel_id)

    async def release(self, kernel_id: str) -> None:
        """``DELETE kernels/{id}/gpu``: a start still waiting for its slice is withdrawn (the
        kernel never starts); a running kernel gives its slice back and runs on."""
        self.require_own(kernel_id)
        start = self.starts.get(kernel_id)
        if (
            start is not None
            and start.pending
            and await asyncio.to_thread(self.backend.is_waiting, kernel_id)
        ):
            self.cancel_start(kernel_id)
            # Answer once the cancelled start has withdrawn its request, so the client's next
            # read (or anyone's) no longer finds it queued.
            await asyncio.wait([start.task], timeout=WITHDRAWN_WITHIN)
            return
        # The kernel's provisioner, as a resize: the backend call %gpu release makes.
        await self._sliced_kernel(kernel_id, "release").give_back()

    async def resize(self, kernel_id: str, memory: object, restart: bool, force: bool = False) -> None:
        """``PATCH kernels/{id}``: the kernel's provisioner applies the size; a restart follows
        where one is needed (asked for, or a kernel pod)."""
        provisioner = self._sliced_kernel(kernel_id, "resize")
        if await provisioner.resize(memory, restart, force):
            await self.kernel_manager.restart_kernel(kernel_id)
        if provisioner.resize_failure:
            raise DoesNotFitError(
                f"{provisioner.resize_failure}; the kernel restarted with its previous size"
            )

    def _sliced_kernel(self, kernel_id: str, action: str) -> SliceProvisioner:
        self.require_own(kernel_id)
        provisioner = self.provisioner_of(kernel_id)
        if provisioner is None:
            raise NoSliceError(f"kernel {kernel_id} holds no GPU slice to {action}")
        return provisioner

    async def suspend(self, kernel_id: str) -> None:
        """``POST kernels/{id}/suspend``: refused while a cell runs (its CUDA calls would wait
        for a resume nobody asks for until the next cell); else the kernel's provisioner does it."""
        provisioner = self._gpushare_kernel(kernel_id)
        kernel = self.kernel_manager.get_kernel(kernel_id)
        if getattr(kernel, "execution_state", "idle") == "busy":
            raise CannotSuspendError(
                "this kernel cannot be suspended while it runs a cell: suspend it once the cell "
                "ends (or put %gpu suspend at the end of the cell); it keeps its slice"
            )
        await provisioner.suspend()

    async def resume(self, kernel_id: str) -> None:
        """``POST kernels/{id}/resume``: waits in the queue like a start, then restores."""
        await self._gpushare_kernel(kernel_id).resume()

    def _gpushare_kernel(self, kernel_id: str) -> SliceProvisioner:
        self.require_own(kernel_id)
        provisioner = self.provisioner_of(kernel_id)
        if provisioner is None:
            raise NoSuchKernelError(f"no GPU kernel {kernel_id} on this server")
        return provisioner

    def kernel_by_token(self, kernel_id: str, token: str | None) -> SliceProvisioner:
        """The provisioner of this server's kernel ``kernel_id``, once ``token`` proves the caller
        is that kernel (404 for no such kernel, 403 for another token)."""
        provisioner = self.provisioner_of(kernel_id)
        if provisioner is None:
            raise NoSuchKernelError(f"no GPU kernel {kernel_id} on this server")
        if not provisioner.token_matches(token):
            raise NotYourSliceError(f"the token does not belong to kernel {kernel_id}")
        return provisioner

    def report_usage(self, kernel_id: str, report: UsageReport) -> None:
        self.backend.report_usage(kernel_id, report)

    def restart_later(self, kernel_id: str, delay: float, on_error: Callable[[BaseException], None]) -> None:
        """Restart ``kernel_id`` after ``delay`` s (a kernel asking for its own restart reads the
        answer first)."""

        def restart() -> None:
            task = asyncio.ensure_future(self.kernel_manager.restart_kernel(kernel_id))
            _restarts.add(task)
            task.add_done_callback(lambda done: _restart_done(done, on_error))

        asyncio.get_running_loop().call_later(delay, restart)

    # ---- the snapshot GET pool, GET kernels and the stream share ------------------------

    def _own_kernels(self) -> Hashable:
        """What of the snapshot depends on this server itself: its kernels, its starts in flight
        and what they are doing, its provisioners' states (the pool's part is the backend's
        change marker). Any change (a start, a resize, a sampling round, a watch event) renews
        the snapshot."""
        return (
            frozenset(self.kernel_manager.list_kernel_ids()),
            tuple((start.kernel_id, start.detail) for start in self.starts.pending()),
            tuple(sorted(self._provisioner_states().items())),
            tuple(sorted(self.unused())),
        )

    def _backend_marker(self) -> Hashable:
        try:
            return self.backend.change_marker()
        except BackendUnavailableError:
            return object()  # never equal: a broken pool is read (and reported) every time

    def _provisioner_states(self) -> dict[str, str]:
        states = {}
        for kernel_id in self.kernel_manager.list_kernel_ids():
            provisioner = self.provisioner_of(kernel_id)
            if provisioner is not None:
                states[kernel_id] = f"{provisioner.state}|{provisioner.resize_failure}"
        return states

    # ---- snapshots -----------------------------------------------------------------------

    def pool(self) -> PoolPayload:
        return self.backend.pool()

    def preview(self, memory: object, mode: object, cores: object) -> Preview:
        """What a start of this size would do now (``GET fit``), from what decides the start."""
        return self.backend.preview(memory, mode, cores)

    async def stream_event(self) -> str:
        """One tick of the stream: fresh device figures, then the shared snapshot."""
        await asyncio.to_thread(self._refresh)
        return (await self.snapshots.current()).event()

    def _refresh(self) -> None:
        with contextlib.suppress(BackendUnavailableError):  # the pool carries the problem
            self.backend.refresh()

    def metrics_snapshot(self) -> StatusPayload:
        try:
            kernels = self.backend.all_kernels()
        except BackendUnavailableError:
            kernels = []
        return {"pool": self.backend.pool(), "kernels": kernels}

    @staticmethod
    def openapi_text() -> str:
        return served_document()


_restarts: set[asyncio.Future[Any]] = set()  # restarts asked for by kernels, until done


def _restart_done(task: asyncio.Future[Any], on_error: Callable[[BaseException], None]) -> None:
    _restarts.discard(task)
    if not task.cancelled() and task.exception() is not None:
        on_error(task.exception())  # type: ignore[arg-type]
