"""What every broker route is built on, the kinds' routes too: :class:`BrokerHandler` knows its
caller (:mod:`.identity`) and has read the request within its limits before the method runs, by
the REST API's rules (:mod:`jupyter_gpushare.core.request_body`); and the checks of a body's common
fields. Domain errors answer with their type's status and name
(:mod:`jupyter_gpushare.backends.broker_client.transport`).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tornado import web

from jupyter_gpushare.backends.broker_base.authority import Authority
from jupyter_gpushare.backends.broker_base.identity import (
    Caller,
    HubIdentity,
    peer_credentials,
    socket_caller,
    user_name,
)
from jupyter_gpushare.backends.broker_client.transport import HOST_HEADER, error_payload
from jupyter_gpushare.backends.protocol import Backend
from jupyter_gpushare.core import request_body
from jupyter_gpushare.core.errors import BackendUnavailableError, GPUShareError, InvalidRequestError
from jupyter_gpushare.core.request_body import MAX_BODY_BYTES
from jupyter_gpushare.http_errors import answerable, message_of

MAX_HOST_BYTES = 253  # a DNS name: where an HTTP caller's server runs
# How much of a request too large for any route is still read, so that its sender can read the
# 413 or 431 that says so (a client still sending finds a closed socket otherwise). Beyond these
# the connection is closed without an answer.
DRAIN_BODY_BYTES = 16 * 1024 * 1024
assert DRAIN_BODY_BYTES > MAX_BODY_BYTES
KERNEL = r"(?P<kernel_id>[^/]+)"  # the kernel id in a route's path


@dataclass
class BrokerState:
    """What every route shares: the backend as callers may use it, and how callers are known."""

    authority: Authority
    hub: HubIdentity | None = None  # None: HTTP callers are refused (a socket-only broker)
    admin_users: frozenset[str] = frozenset()


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
        self._peer = _socket_peer(self.request)  # (pid, uid) over the Unix socket, else None

    def _request_summary(self) -> str:
        # tornado's access and error log lines name a caller by its address, which on the Unix
        # socket says nothing ("0.0.0.0"): they name who the broker took the caller for.
        return f"{self.request.method} {self.request.uri} ({self.who()})"

    def who(self) -> str:
        """The caller as the log names it: ``user alice, uid 1001, pid 4242`` on the socket,
        ``hub user alice, 10.0.0.7`` over HTTP (``, admin`` for an admin); an HTTP caller not
        (yet) identified by its address only."""
        caller: Caller | None = getattr(self, "caller", None)
        admin = ", admin" if caller is not None and caller.admin else ""
        if self._peer is not None:
            pid, uid = self._peer
            name = caller.user if caller is not None else user_name(uid)
            return f"user {name}, uid {uid}, pid {pid}{admin}"
        if caller is not None:
            return f"hub user {caller.user}, {self.request.remote_ip}{admin}"
        return f"{self.request.remote_ip}, not identified"

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

    def scoped(self) -> Backend:
        """The broker's backend as the caller may use it (their quotas, others' kernels anonymous)."""
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


def _socket_peer(request: Any) -> tuple[int, int] | None:
    stream = getattr(request.connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, _ = peer_credentials(sock)
    except OSError:
        return None
    return pid, uid


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


__all__ = [
    "DRAIN_BODY_BYTES",
    "KERNEL",
    "BrokerHandler",
    "BrokerState",
    "kernel_id_field",
    "label_field",
    "request_fields",
]
