"""The backend of a process that uses a GPU broker: the same calls, answered by the broker.

Chosen by :func:`~jupyter_gpushare.backends.backend_for` when ``c.GPUShare.broker_url`` (or
``$JUPYTER_GPUSHARE_BROKER_URL``) is set. The process then opens no ledger and holds no cluster
credentials: every question goes to the broker (``jupyter gpushare broker``), which answers for
the caller it identified — the peer's OS user on its Unix socket, the hub user of the presented
token over HTTP — with that caller's quotas, and others' kernels anonymous. What the broker
refuses comes back as the same domain error an embedded backend raises.

Besides the service API (:class:`~jupyter_gpushare.backends.protocol.Backend`) it offers what local
kernels' starts and the kernels themselves use
(:class:`~jupyter_gpushare.backends.protocol.NodeSlices`); kernel pods are the broker's business
(:mod:`jupyter_gpushare.backends.kubernetes.pods_from_broker`, through this client's ``client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Hashable
from typing import Any

from jupyter_gpushare.backends.broker_client.feed import BrokerFeed
from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
from jupyter_gpushare.backends.broker_client.wire import (
    device_from_json,
    holding_from_json,
    outcome_from_json,
    record_from_json,
    server_kernels_to_json,
    usage_to_json,
)
from jupyter_gpushare.backends.keys import token_digest
from jupyter_gpushare.backends.processes import identify
from jupyter_gpushare.backends.protocol import Backend, NodeSlices, ServerHooks, ServerKernels, WaitCallback
from jupyter_gpushare.backends.queue_wait import wait_for_slice
from jupyter_gpushare.config import GPUShare, settings_env
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.capabilities import Capabilities, offline
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.errors import (
    BackendUnavailableError,
    GPUShareError,
    NotOfferedError,
    NotYourSliceError,
)
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, UsagePayload, UsageRowPayload
from jupyter_gpushare.core.placement.preview import Preview
from jupyter_gpushare.core.records import (
    Holding,
    Outcome,
    ProcessIdentity,
    ReleasedSlice,
    Resumption,
    SliceRecord,
    Suspension,
    UsageReport,
    Waiting,
)
from jupyter_gpushare.core.slice_request import SliceRequest, make_slice_request

log = logging.getLogger("jupyter_gpushare")

# Seconds: a waiting start asks the broker after its place at least this often, well within the
# broker's GPUShareBroker.waiting_lease (after which it drops a request nobody asks after).
MAX_POLL_INTERVAL = 2.0


class RemoteBackend(Backend, NodeSlices):
    """The pool as the broker shows it to this process's user, and local kernels' slices as the
    broker holds them."""

    def __init__(self, settings: GPUShare, client: BrokerClient | None = None) -> None:
        self.settings = settings
        self.client = client or BrokerClient(settings.effective_broker_url())
        self.hooks = ServerHooks()
        self._info: dict[str, Any] | None = None
        self._info_lock = threading.Lock()
        self._tokens: dict[str, str] = {}  # own-slice tokens of the kernels this process started
        self._envs: dict[str, dict[str, str]] = {}  # the slice variables the broker gave each
        self.feed: BrokerFeed | None = None  # a server follows the broker's stream
        self._kernels_cache: tuple[str, str, list[KernelPayload]] | None = None
        self._reported = ""  # the fault report_fault logged last
        self._reporting = threading.Lock()  # kernels' cleanups report from worker threads
        if settings.reconcile_on_start:
            # As a local backend reconciles the ledger it opens: dead kernels' slices go first.
            with contextlib.suppress(GPUShareError):
                self.client.call("POST", "reconcile", {})

    # ---- what the broker says of itself and of us ----------------------------------------------

    def info(self) -> dict[str, Any]:
        """``{"backend", "remote_kernels", "capabilities", "user", "admin", "location",
        "version"}`` as the broker answers (kept once it answered)."""
        with self._info_lock:
            if self._info is None:
                self._info = dict(self.client.call("GET", "info"))
            return self._info

    def _info_or_none(self) -> dict[str, Any] | None:
        try:
            return self.info()
        except GPUShareError:
            return None

    @property
    def name(self) -> str:
        info = self._info_or_none()
        return str(info["backend"]) if info else self.settings.backend

    @property
    def remote_kernels(self) -> bool:
        """Whether the broker's kernels run elsewhere (pods), as it says."""
        info = self._info_or_none()
        return bool(info["remote_kernels"]) if info else False

    @property
    def capabilities(self) -> Capabilities:
        """What the broker says it offers its clients' kernels (a broker of kernel pods what pods
        do; a node's broker places, resizes and releases). A broker that cannot be reached offers
        nothing, and every refusal says why."""
        try:
            info = self.info()
        except GPUShareError as error:
            return offline(str(error))
        return Capabilities.from_wire(info["capabilities"])

    # ---- the service API (protocol.Backend) -----------------------------------------------------

    def pool(self) -> PoolPayload:
        followed = self.feed.pool() if self.feed is not None else None
        pool: PoolPayload = followed if followed is not None else self.client.call("GET", "pool")  # type: ignore[assignment]
        return pool

    def kernels(self, server: ServerKernels) -> list[KernelPayload]:
        """Asked of the broker — again only once its marker moved, while the feed is live."""
        known = server_kernels_to_json(server)
        key = json.dumps(known, sort_keys=True)
        state = self.feed.latest() if self.feed is not None else None
        cached = self._kernels_cache
        if state is not None and cached is not None and cached[:2] == (state.marker, key):
            return copy.deepcopy(cached[2])
        views: list[KernelPayload] = self.client.call("POST", "server-kernels", {"kernels": known})
        if state is not None:
            self._kernels_cache = (state.marker, key, views)
        return copy.deepcopy(views)

    def all_kernels(self) -> list[KernelPayload]:
        views: list[KernelPayload] = self.client.call("GET", "kernels")
        return views

    def change_marker(self) -> Hashable:
        state = self.feed.latest() if self.feed is not None else None
        return state.marker if state is not None else str(self.client.call("GET", "marker")["marker"])

    def change_marker_at_once(self) -> Hashable | None:
        state = self.feed.latest() if self.feed is not None else None  # else: ask the broker
        return state.marker if state is not None else None

    def modes(self) -> list[str]:
        return [str(mode) for mode in self.client.call("GET", "modes")]

    def check(
        self, memory: object = None, mode: object = None, cores: object = None, kernel_id: str = ""
    ) -> SliceRequest:
        """Checked by the broker with its own limits and defaults; returned as it resolved them."""
        checked = self.client.call(
            "POST",
            "check",
            {"gpu_memory": memory, "gpu_mode": mode, "gpu_cores": cores, "kernel_id": kernel_id},
        )
        return make_slice_request(
            checked["size"], checked["mode"], checked["cores"], self.settings.default_memory, checked["mode"]
        )

    def preview(self, memory: object, mode: object = None, cores: object = None) -> Preview:
        """What a start would do now, as the broker's allocator answers for this user."""
        answer = self.client.call(
            "POST", "preview", {"gpu_memory": memory, "gpu_mode": mode, "gpu_cores": cores}
        )
        return Preview(**answer)

    def check_access(self) -> None:
        """Raise when the broker cannot be reached or cannot read its pool."""
        self.client.call("GET", "access")

    def is_waiting(self, kernel_id: str) -> bool:
        return bool(self.client.call("GET", f"slices/{kernel_id}/waiting")["waiting"])

    def report_usage(self, kernel_id: str, report: UsageReport) -> None:
        self.client.call("POST", f"slices/{kernel_id}/usage", usage_to_json(report))

    def refresh(self) -> None:
        self.client.call("POST", "refresh", {})

    def problem(self) -> str | None:
        try:
            self.info()
        except GPUShareError as error:
            return str(error)
        return None

    def location(self) -> str:
        info = self._info_or_none()
        where = f": {info['location']}" if info and info.get("location") else ""
        return f"GPU broker at {self.client.url}{where}"

    def usage(self, since: float, by: str) -> UsagePayload:
        """The broker's accounting of this user's kernels (everyone's for its admin)."""
        answer: UsagePayload = self.client.call("GET", f"usage?since={since:.0f}s&by={by}")
        return answer

    def usage_totals(self) -> list[UsageRowPayload]:
        rows: list[UsageRowPayload] = self.client.call("GET", "usage/totals")
        return rows

    def attach_server(self, hooks: ServerHooks) -> None:
        """A server in this process: follow the broker's stream from now on; keep the hooks for
        the kernel pods it starts (where they report, which browsers to renew)."""
        self.hooks = hooks
        if self.feed is None:
            self.feed = BrokerFeed(self.client).start()
            self.client.on_change = self.feed.changed_here

    # ---- local kernels' slices (protocol.NodeSlices) --------------------------------------------

    async def acquire(
        self,
        kernel_id: str,
        request: SliceRequest,
        *,
        kernel_name: str = "",
        path: str = "",
        on_wait: WaitCallback | None = None,
    ) -> SliceRecord:
        """Ask the broker for a slice and wait in its queue (polling, so a broker that goes away
        fails the wait at once instead of hanging it). The token stays here: the broker keeps
        only its digest, so a kernel proves itself to the broker as it would to the ledger."""
        token = secrets.token_urlsafe(24)
        self._tokens[kernel_id] = token
        body = {
            "kernel_id": kernel_id,
            "gpu_memory": request.size.canonical,
            "gpu_mode": request.mode.name,
            "gpu_cores": request.cores,
            "kernel_name": kernel_name,
            "path": path,
            "token_hash": token_digest(token),
        }
        first = await asyncio.to_thread(self._outcome, "POST", "slices", body)
        place = _Place(self, kernel_id, first)
        return await wait_for_slice(
            kernel_id,
            request,
            first,
            lambda: asyncio.to_thread(place.ask),
            lambda: asyncio.to_thread(self._withdraw, kernel_id),
            min(self.settings.queue_poll_interval, MAX_POLL_INTERVAL),
            on_wait,
        )

    def _outcome(self, method: str, route: str, body: Any) -> Any:
        answer = self.client.call(method, route, body)
        if answer.get("env") is not None:
            self._envs[answer["record"]["kernel_id"]] = dict(answer["env"])
        return outcome_from_json(answer)

    def _withdraw(self, kernel_id: str) -> None:
        # An unreachable broker drops the request itself once the asking process is gone.
        with contextlib.suppress(UnreachableError):
            self.free(kernel_id)

    def attach_kernel(self, kernel_id: str, pid: int | None) -> None:
        """Let the slice follow kernel process ``pid`` — the broker checks that it is ours."""
        identity = identify(pid) if pid is not None else None
        if pid is not None and identity is None:
            raise GPUShareError(f"kernel {kernel_id}'s process {pid} is gone")
        body = {"pid": identity.pid, "start": identity.start} if identity else {"pid": None}
        self.client.call("PUT", f"slices/{kernel_id}/kernel", body)

    def start_monitoring(self) -> None:
        """The broker samples every kernel on the node."""

    def free(self, kernel_id: str) -> SliceRecord | None:
        answer = self.client.call("DELETE", f"slices/{kernel_id}")
        self._envs.pop(kernel_id, None)
        return record_from_json(answer["record"]) if answer and answer.get("record") else None

    def report_fault(self, fault: BackendUnavailableError) -> None:
        with self._reporting:
            said, self._reported = self._reported, str(fault)
        if said != str(fault):
            log.warning("jupyter_gpushare: %s", fault)

    def check_claim(self, kernel_id: str, token: str | None, caller: ProcessIdentity) -> None:
        """Checked by the broker with the calling process it sees (``caller`` is ours: the
        broker takes no process's word for who it is)."""
        self.client.call("POST", f"slices/{kernel_id}/claim", {}, token=token or "")

    def resize(self, kernel_id: str, memory: object, force: bool = False) -> SliceRecord:
        if force:
            self.capabilities.require("can_force_shrink")
        answer = self.client.call("PATCH", f"slices/{kernel_id}", {"gpu_memory": memory})
        self._envs[kernel_id] = dict(answer["env"])
        return record_from_json(answer["record"])

    def give_back(self, kernel_id: str) -> tuple[SliceRecord, Holding]:
        """The broker measures what the kernel's processes hold (kept reserved), releases the
        slice and keeps the kernel's claim on its id."""
        answer = self.client.call("DELETE", f"slices/{kernel_id}/gpu")
        self._envs.pop(kernel_id, None)
        return record_from_json(answer["record"]), holding_from_json(answer["held"])

    def suspend(self, kernel_id: str) -> Suspension:
        self.capabilities.require("can_suspend")
        raise AssertionError("unreachable: no broker suspends")  # pragma: no cover

    async def resume(self, kernel_id: str, on_wait: WaitCallback | None = None) -> Resumption:
        self.capabilities.require("can_suspend", "resume")
        raise AssertionError("unreachable: no broker resumes")  # pragma: no cover

    def released(self, kernel_id: str) -> ReleasedSlice | None:
        return None  # the broker keeps no held memory or suspended state for a kernel yet

    def declare_held(self, kernel_id: str, used: int) -> None:
        raise NotOfferedError(
            "declaring held memory is not available through a GPU broker yet: nothing was changed"
        )

    def kernel_env(self, record: SliceRecord) -> dict[str, str]:
        """This process's settings (the broker's address among them), the slice's variables as
        the broker made them, and the kernel's own-slice token."""
        env = settings_env(self.settings)
        slice_env = self._envs.get(record.kernel_id)
        if slice_env is None:
            slice_env = dict(self.client.call("GET", f"slices/{record.kernel_id}")["env"])
        env.update(slice_env)
        token = self._tokens.get(record.kernel_id)
        if token:
            env[env_names.TOKEN] = token
        return env

    def own_slice(self, kernel_id: str, token: str | None) -> SliceRecord | None:
        """The caller's slice, if ``token`` is its kernel's (None when it holds none; an error
        when the slice is another kernel's)."""
        answer = self.client.call("GET", f"slices/{kernel_id}?as_kernel=1", token=token or "")
        if not answer or answer.get("record") is None:
            return None
        self._envs[kernel_id] = dict(answer["env"])
        return record_from_json(answer["record"])

    def own_warnings(self, kernel_id: str, token: str | None) -> tuple[str, ...]:
        """The warnings on the caller's slice, as the broker keeps them (none without one, or
        with another kernel's token)."""
        try:
            record = self.own_slice(kernel_id, token)
        except NotYourSliceError:
            return ()
        return record.warnings if record is not None else ()

    def token_for(self, kernel_id: str) -> str | None:
        return self._tokens.get(kernel_id)

    def remember_token(self, kernel_id: str, token: str) -> None:
        self._tokens[kernel_id] = token

    def devices(self) -> list[Device]:
        return [device_from_json(item) for item in self.client.call("GET", "devices")]

    def simulated(self) -> bool:
        return bool(self.pool()["simulated"])

    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        body = {"busy": busy, "at": at, "idle_after": idle_after, "idle_action": idle_action}
        self.client.call("POST", f"slices/{kernel_id}/activity", body, token=token or "")


class _Place:
    """A waiting start asking the broker after its place. A broker that goes away meanwhile (a
    restart) is waited for as long as a queued start may wait (``queue_timeout``): the request
    is kept in its ledger, and the start goes on where it was once the broker answers again."""

    def __init__(self, backend: RemoteBackend, kernel_id: str, first: Outcome) -> None:
        self.backend = backend
        self.kernel_id = kernel_id
        self.position = first.position if isinstance(first, Waiting) else 1
        self.away_since: float | None = None

    def ask(self) -> Outcome:
        try:
            outcome: Outcome = self.backend._outcome("POST", f"slices/{self.kernel_id}/place", {})
        except UnreachableError as error:
            now = time.monotonic()
            self.away_since = self.away_since if self.away_since is not None else now
            if now - self.away_since >= self.backend.settings.queue_timeout:
                raise
            return Waiting(self.position, f"{error}; waiting for it to come back")
        self.away_since = None
        if isinstance(outcome, Waiting):
            self.position = outcome.position
        return outcome


_backends: dict[tuple[str, str, int], RemoteBackend] = {}
_lock = threading.Lock()


def remote_backend(settings: GPUShare) -> RemoteBackend:
    """This process's client of the broker at ``broker_url`` (one per address and process)."""
    key = (settings.effective_broker_url(), settings.backend, os.getpid())
    with _lock:
        backend = _backends.get(key)
        if backend is None:
            backend = _backends[key] = RemoteBackend(settings)
        else:
            backend.settings = settings
        return backend


__all__ = ["RemoteBackend", "remote_backend"]
