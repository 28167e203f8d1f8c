"""The broker's routes of the service API, under ``/api/gpushare/broker/``, for every backend.

Each request is identified before anything else (:mod:`.identity`): a caller the broker cannot
identify gets 401, a token the hub refuses 403, and nothing is read or changed. Requests are
read by the same rules as the REST API's (:mod:`jupyter_gpushare.request_body`): headers and a
body within their limits (431, 413: answered, the rest of a large body read and dropped), JSON
no deeper than 32 levels, text only, names and paths without control characters, kernel ids
that are UUIDs; then field by field. Bad input is a 4xx ``{"message", "error"}`` and changes
nothing. Domain errors answer with their type's status and carry their type's name, so the
client raises the same error an embedded backend would (:mod:`jupyter_gpushare.backends.transport`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tornado import web
from tornado.iostream import StreamClosedError

from .. import request_body
from ..backends.broker_feed import KEEP_ALIVE
from ..backends.transport import HOST_HEADER, error_payload
from ..backends.wire import server_kernels_from_json
from ..capabilities import through_a_broker
from ..errors import BackendUnavailableError, GPUShareError, InvalidRequestError
from ..http_errors import answerable, answering_domain_errors, message_of
from ..records import UsageReport
from .authority import Authority, require_own
from .door import DRAIN_BODY_BYTES
from .identity import Caller, HubIdentity, socket_caller

MAX_HOST_BYTES = 253  # a DNS name: where an HTTP caller's server runs
STREAM_TICK_MIN, STREAM_TICK_MAX = 0.1, 1.0  # seconds between looks at the marker, per stream
log = logging.getLogger("jupyter_gpushare.broker")
BROKER_RUN = uuid.uuid4().hex  # this broker process, in its change markers


def package_version() -> str:
    try:
        return importlib.metadata.version("jupyter-gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class BrokerState:
    """What every route shares: the backend as callers may use it, and how callers are known."""

    authority: Authority
    hub: HubIdentity | None = None  # None: HTTP callers are refused (a socket-only broker)
    admin_users: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)


@web.stream_request_body
class BrokerHandler(web.RequestHandler):
    """A broker route: the caller is known (``self.caller``) and the request within its limits
    before the method runs. The body is streamed in: kept up to the limit, dropped beyond it, so
    a body too large costs no memory and still gets its answer."""

    caller: Caller

    def initialize(self, state: BrokerState) -> None:
        self.state = state
        self._body = bytearray()
        self._body_size = 0

    def check_xsrf_cookie(self) -> None:
        return None  # no cookies: the socket's peer or the hub token is the identity

    async def prepare(self) -> None:
        try:
            self._check_request()
            self.caller = await self._identify()
            kernel_id = self.path_kwargs.get("kernel_id")
            if kernel_id is not None:
                request_body.check_kernel_id(kernel_id, "the kernel id in the path")
        except GPUShareError as error:
            if not self._body_expected():
                raise answerable(error) from None
            # Answered once the body is in: tornado closes a connection whose body it has not
            # read, so a client still sending it would meet a closed socket, not the answer.
            refusal = answerable(error)
            self._body_size = DRAIN_BODY_BYTES  # dropped as it comes (see data_received)

            def refuse(*args: Any, **kwargs: Any) -> None:
                raise refusal

            setattr(self, self.request.method.lower(), refuse)  # type: ignore[union-attr]

    def _body_expected(self) -> bool:
        """Whether the client declared a body still to be read (one too large to read is not)."""
        declared = self.request.headers.get("Content-Length", "")
        chunked = "chunked" in self.request.headers.get("Transfer-Encoding", "").lower()
        return chunked or (declared.isdigit() and 0 < int(declared) <= DRAIN_BODY_BYTES)

    def _check_request(self) -> None:
        request = self.request
        line = f"{request.method} {request.uri} {request.version}"
        request_body.check_headers(line, request.headers.get_all())
        declared = request.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > request_body.MAX_BODY_BYTES:
            if int(declared) > DRAIN_BODY_BYTES:  # not worth reading: answered, then closed
                raise request_body.too_large(int(declared))
            self._body_size = int(declared)  # refused once read (see json_body)

    def data_received(self, chunk: bytes) -> None:
        if self._body_size > request_body.MAX_BODY_BYTES:
            return  # too large, known from its length: dropped as it comes
        self._body_size += len(chunk)
        if self._body_size > request_body.MAX_BODY_BYTES:
            self._body = bytearray()  # chunked and too large: dropped from here on
        else:
            self._body += chunk

    async def _identify(self) -> Caller:
        stream = getattr(self.request.connection, "stream", None)
        sock = getattr(stream, "socket", None)
        if sock is not None and sock.family == socket.AF_UNIX:
            return socket_caller(sock, self.state.admin_users)
        if self.state.hub is None:
            raise InvalidRequestError("this GPU broker serves its Unix socket only")
        try:
            host = request_body.check_label(
                HOST_HEADER, self.request.headers.get(HOST_HEADER, ""), MAX_HOST_BYTES
            )
            return await self.state.hub.caller(self.request.headers.get("Authorization", ""), host)
        except web.HTTPError as error:  # the hub itself cannot be asked
            raise BackendUnavailableError(
                f"the GPU broker cannot check tokens with the hub: {message_of(error, error.status_code)}"
            ) from None

    @property
    def authority(self) -> Authority:
        return self.state.authority

    def scoped(self) -> Any:
        return self.authority.as_seen_by(self.caller)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        payload = (
            error_payload(error)
            if isinstance(error, GPUShareError)
            else {"message": message_of(error, status_code), "error": ""}
        )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    def json_body(self) -> dict[str, Any]:
        """The body as a JSON object, read by the REST API's rules (a 4xx that names the limit)."""
        if self._body_size > request_body.MAX_BODY_BYTES:
            raise request_body.too_large(self._body_size)
        return request_body.json_object(bytes(self._body))

    def answer(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    async def run(self, call: Callable[..., Any], *args: Any) -> Any:
        """A backend call, off the event loop (the ledger and the API client block)."""
        return await asyncio.to_thread(call, *args)


# ---- checking bodies ---------------------------------------------------------------------------


def kernel_id_field(body: dict[str, Any], *, required: bool = False) -> str:
    """``kernel_id`` of a body: a UUID, or "" where it may be left out."""
    value = body.get("kernel_id")
    if value in (None, "") and not required:
        return ""
    return request_body.check_kernel_id(value)


def label_field(body: dict[str, Any], name: str, max_bytes: int) -> str:
    """A name or path to be stored and shown ("" when left out), by the REST API's rule."""
    value = body.get(name)
    return "" if value is None else request_body.check_label(name, value, max_bytes)


def request_fields(body: dict[str, Any]) -> tuple[object, object, object]:
    """``(gpu_memory, gpu_mode, gpu_cores)`` type-checked (values are the backend's to check)."""
    memory, mode, cores = body.get("gpu_memory"), body.get("gpu_mode"), body.get("gpu_cores")
    for name, value, kinds in (
        ("gpu_memory", memory, (str, int)),
        ("gpu_mode", mode, (str,)),
        ("gpu_cores", cores, (str, int)),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            what = "a string" if kinds == (str,) else "a string or a whole number"
            raise InvalidRequestError(f"{name} must be {what}, not {json.dumps(value)}")
    return memory, mode, cores


def usage_report(body: dict[str, Any]) -> UsageReport:
    used, utilization = body.get("memory_used"), body.get("utilization")
    source = body.get("source", "kernel")
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise InvalidRequestError(f"memory_used must be a whole number of bytes, not {json.dumps(used)}")
    if utilization is not None and (
        isinstance(utilization, bool) or not isinstance(utilization, int) or not 0 <= utilization <= 100
    ):
        raise InvalidRequestError(f"utilization must be 0-100 or null, not {json.dumps(utilization)}")
    if source not in ("kernel", "simulated"):
        raise InvalidRequestError(f'source must be "kernel" or "simulated", not {json.dumps(source)}')
    return UsageReport(used, utilization, source)


# ---- the routes every broker serves ------------------------------------------------------------


class InfoHandler(BrokerHandler):
    """``GET info``: which backend, who the broker says the caller is, and what it offers its
    clients' kernels (its backend's capabilities, less what its routes do not carry)."""

    @answering_domain_errors
    async def get(self) -> None:
        backend = self.authority.backend
        self.answer(
            {
                "backend": backend.name,
                "remote_kernels": backend.remote_kernels,
                "capabilities": through_a_broker(backend.capabilities).to_wire(),
                "user": self.caller.user,
                "admin": self.caller.admin,
                "location": await self.run(backend.location),
                "version": package_version(),
            }
        )


class PoolHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.scoped().pool))


class KernelsHandler(BrokerHandler):
    """``GET kernels``: every slice, others' anonymous (``status``, metrics)."""

    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.scoped().all_kernels))


class ServerKernelsHandler(BrokerHandler):
    """``POST server-kernels`` ``{"kernels": <what the server knows of its kernels>}``: the
    server's ``GET kernels``, described by the backend for that server."""

    @answering_domain_errors
    async def post(self) -> None:
        try:
            known = server_kernels_from_json(self.json_body().get("kernels", {}))
        except ValueError as error:
            raise InvalidRequestError(str(error)) from None
        self.answer(await self.run(self.scoped().kernels, known))


class MarkerHandler(BrokerHandler):
    """``GET marker``: changes whenever the pool or any kernel may look different. A restarted
    broker counts afresh, so its markers carry this process's own id: a server's cached view from
    before the restart is never taken for current."""

    @answering_domain_errors
    async def get(self) -> None:
        marker = await self.run(self.authority.backend.change_marker)
        self.answer({"marker": f"{BROKER_RUN}:{marker}"})


class StreamHandler(BrokerHandler):
    """``GET stream``: server-sent events ``{"marker", "pool"}`` (the caller's view) whenever the
    marker changes, and a keep-alive line every ``KEEP_ALIVE`` seconds otherwise. Servers follow
    it instead of asking for the pool and the marker over and over (:mod:`..backends.broker_feed`)."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        backend, scoped = self.authority.backend, self.scoped()
        interval = min(max(backend.settings.sample_interval, STREAM_TICK_MIN), STREAM_TICK_MAX)
        last, quiet_since = "", time.monotonic()
        try:
            while True:
                try:
                    marker = f"{BROKER_RUN}:{await self.run(backend.change_marker)}"
                    if marker != last:
                        pool = await self.run(scoped.pool)
                        event = {"marker": marker, "pool": pool, "tick": interval}
                        self.write(f"data: {json.dumps(event)}\n\n")
                        await self.flush()
                        last, quiet_since = marker, time.monotonic()
                except GPUShareError as error:  # the pool cannot be read now: say it on the next try
                    log.debug("stream: %s", error)
                if time.monotonic() - quiet_since >= KEEP_ALIVE:
                    self.write(": alive\n\n")
                    await self.flush()
                    quiet_since = time.monotonic()
                await asyncio.sleep(interval)
        except StreamClosedError:
            return


class ModesHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.authority.backend.modes))


class CheckHandler(BrokerHandler):
    """``POST check``: the request as the broker resolves it, or why it can never start."""

    @answering_domain_errors
    async def post(self) -> None:
        body = self.json_body()
        memory, mode, cores = request_fields(body)
        kernel_id = kernel_id_field(body)
        request = await self.run(self.scoped().check, memory, mode, cores, kernel_id)
        self.answer({"size": request.size.text, "mode": request.mode.name, "cores": request.cores})


class PreviewHandler(BrokerHandler):
    """``POST preview``: what a start of this request would do now, for the caller (``GET fit``)."""

    @answering_domain_errors
    async def post(self) -> None:
        memory, mode, cores = request_fields(self.json_body())
        preview = await self.run(self.scoped().preview, memory, mode, cores)
        self.answer(dataclasses.asdict(preview))


class AccessHandler(BrokerHandler):
    """``GET access``: 200 when the broker can read its pool; its fault otherwise."""

    @answering_domain_errors
    async def get(self) -> None:
        await self.run(self.authority.backend.check_access)
        self.answer({})


class RefreshHandler(BrokerHandler):
    @answering_domain_errors
    async def post(self) -> None:
        await self.run(self.authority.backend.refresh)
        self.answer({})


class ReconcileHandler(BrokerHandler):
    """``POST reconcile``: release dead kernels' slices now (``status`` does this first)."""

    @answering_domain_errors
    async def post(self) -> None:
        await self.run(self.authority.housekeeping)
        self.answer({})


class WaitingHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        self.answer({"waiting": await self.run(self.scoped().is_waiting, kernel_id)})


class ReleaseHandler(BrokerHandler):
    """``DELETE slices/{id}/gpu``: give the slice back while the kernel runs on."""

    @answering_domain_errors
    async def delete(self, kernel_id: str) -> None:
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        await self.run(self.scoped().release, kernel_id)
        self.answer({})


class UsageHandler(BrokerHandler):
    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        report = usage_report(self.json_body())
        await self.run(require_own, self.authority, self.caller, kernel_id)
        await self.run(self.scoped().report_usage, kernel_id, report)
        self.answer({})


class NotFoundHandler(BrokerHandler):
    """Any other path: a 404 in the broker's JSON."""

    async def prepare(self) -> None:
        await super().prepare()
        raise web.HTTPError(404, f"the GPU broker has no route {self.request.path}")


KERNEL = r"(?P<kernel_id>[^/]+)"

ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("info", InfoHandler),
    ("pool", PoolHandler),
    ("kernels", KernelsHandler),
    ("server-kernels", ServerKernelsHandler),
    ("marker", MarkerHandler),
    ("stream", StreamHandler),
    ("modes", ModesHandler),
    ("check", CheckHandler),
    ("preview", PreviewHandler),
    ("access", AccessHandler),
    ("refresh", RefreshHandler),
    ("reconcile", ReconcileHandler),
    (f"slices/{KERNEL}/waiting", WaitingHandler),
    (f"slices/{KERNEL}/gpu", ReleaseHandler),
    (f"slices/{KERNEL}/usage", UsageHandler),
]

__all__ = [
    "ROUTES",
    "BrokerHandler",
    "BrokerState",
    "NotFoundHandler",
    "kernel_id_field",
    "label_field",
    "request_fields",
    "usage_report",
]
