"""One JSON call to the GPU broker, over its Unix socket or HTTP (the client's only wire) — and,
with another prefix, to the jupyter server that started a kernel pod (the pod's own routes).

``unix:/run/jupyter-gpushare/broker.sock``: the broker learns who calls from the socket's peer
credentials, so nothing is sent to prove it. ``http://…``: the caller presents its JupyterHub API
token (a single-user server's own ``$JUPYTERHUB_API_TOKEN``), which the broker checks with the hub.
A broker that cannot be reached fails the call at once with a sentence naming it
(:class:`UnreachableError`, as does a kernel pod's server); a broker that
refuses answers with the domain error it raised, so callers handle both like the errors of a
backend in their own process. This module is the one place that maps a refusal to its answer and
back: it travels as ``{"message", "error"}`` (:func:`error_payload`), the sentence and the name of
its domain error type, so a client raises the same type, with the same HTTP status, as an
embedded backend would (:func:`error_from`; by status where an answer names none).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpushare.core import errors
from jupyter_gpushare.core.errors import BackendUnavailableError, GPUShareError

CALL_TIMEOUT = 30.0  # seconds; every call is short (a queued start polls instead of waiting)
QUEUE_FULL_PAUSE = 0.005  # seconds before trying a full listen queue again (doubling, to 0.2)
TOKEN_HEADER = "X-GPUShare-Token"  # a kernel's own-slice token, for calls about its own slice
HOST_HEADER = "X-GPUShare-Host"  # where the caller runs: names its server's kernel pods (HTTP)
API_PREFIX = "/api/gpushare/broker/"
# POSTs that change nothing (a server's feed stays trusted after them).
READING = frozenset({("POST", "check"), ("POST", "server-kernels"), ("POST", "preview")})


# ---- refusals: a domain error as an answer, and back ---------------------------------------------

_ERRORS: dict[str, type[GPUShareError]] = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, GPUShareError)
}


def register_error(cls: type[GPUShareError]) -> type[GPUShareError]:
    """Let errors defined outside :mod:`jupyter_gpushare.core.errors` travel by name (a decorator)."""
    _ERRORS[cls.__name__] = cls
    return cls


def error_payload(error: GPUShareError) -> dict[str, str]:
    return {"message": str(error), "error": error.plain_type().__name__}


# For an answer without a known error name (a proxy's, a tornado error's): the type by status.
_BY_STATUS: dict[int, type[GPUShareError]] = {
    401: errors.NotAuthenticatedError,
    403: errors.NotYourSliceError,
    404: errors.NoSuchKernelError,
    409: errors.DoesNotFitError,
    500: errors.ConfigurationError,
}


def error_from(payload: Any, status: int) -> GPUShareError:
    """The domain error a broker (or a kernel pod's server) answered with (by name; else by
    status)."""
    message = str(payload.get("message") or "") if isinstance(payload, dict) else ""
    name = str(payload.get("error") or "") if isinstance(payload, dict) else ""
    cls = _ERRORS.get(name) or _BY_STATUS.get(status)
    if cls is None:
        cls = errors.BackendUnavailableError if status >= 500 else errors.InvalidRequestError
    return cls(message or f"the GPU broker answered {status}")


@register_error
class UnreachableError(BackendUnavailableError):
    """The other side of a call does not answer (not running, wrong address, refused on the way):
    the GPU broker named by ``broker_url``, or the jupyter server a kernel pod reports to. The
    sentence names which (:class:`BrokerClient`'s ``unreachable``)."""


class _UnixConnection(http.client.HTTPConnection):
    timeout: float

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        # A Unix socket whose listen queue is full refuses a connect at once (EAGAIN) where TCP
        # would wait: a burst of callers (200 starts at once, servers back after a broker
        # restart) waits its turn until the call's timeout instead of failing "not reachable".
        deadline = time.monotonic() + self.timeout
        pause = QUEUE_FULL_PAUSE
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._path)
            except BlockingIOError:
                sock.close()
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            return


@dataclass(frozen=True)
class SocketRefusal:
    """What on the way to the broker's socket refuses this process: a directory it may not pass
    through, a socket it may not write to (``denied``), or no socket at all."""

    path: Path
    denied: bool
    mode: int = 0
    owner: str = ""
    group: str = ""

    @property
    def directory(self) -> bool:
        return self.path.is_dir()

    @property
    def group_may(self) -> bool:
        """Whether the members of its group may pass (a directory) or connect (the socket)."""
        return bool(self.mode & (stat.S_IXGRP if self.directory else stat.S_IWGRP))

    def attributes(self) -> str:
        return f"mode {self.mode:04o}, owner {self.owner}, group {self.group}"

    def sentence(self) -> str:
        if not self.denied:
            return (
                f"there is no socket at {self.path}: is the broker running "
                f"(jupyter gpushare broker --socket {self.path})?"
            )
        if self.directory:
            return f"{self.path} does not let you through ({self.attributes()})"
        return f"the socket {self.path} does not let you connect ({self.attributes()})"


def refusal_on_the_way(path: str) -> SocketRefusal | None:
    """What on the way to the broker's socket at ``path`` refuses this process (None: nothing)."""
    for directory in reversed(Path(path).parents):
        if directory.exists() and not os.access(directory, os.X_OK):
            return _denied(directory)
    socket_file = Path(path)
    if not socket_file.exists():
        return SocketRefusal(socket_file, denied=False)
    if not os.access(socket_file, os.W_OK):
        return _denied(socket_file)
    return None


def socket_refusal(path: str) -> str | None:
    """The sentence of :func:`refusal_on_the_way` (None: nothing found)."""
    refusal = refusal_on_the_way(path)
    return refusal.sentence() if refusal is not None else None


def _denied(path: Path) -> SocketRefusal:
    import grp
    import pwd

    info = path.stat()
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return SocketRefusal(path, denied=True, mode=stat.S_IMODE(info.st_mode), owner=owner, group=group)


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker listens: a Unix socket path, or an HTTP base URL; ``prefix`` goes
    between the URL's path and a route (the broker's API, or nothing for a kernel's own routes)."""

    url: str
    prefix: str = API_PREFIX

    @property
    def socket_path(self) -> str | None:
        return self.url.removeprefix("unix:") if self.url.startswith("unix:") else None

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        parsed = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
        return kind(parsed.hostname or "localhost", parsed.port, timeout=timeout)

    def path(self, route: str) -> str:
        base = "" if self.socket_path is not None else urllib.parse.urlsplit(self.url).path.rstrip("/")
        return f"{base}{self.prefix}{route}"


class BrokerClient:
    """Calls to one broker, as this process (and, for a kernel, with its own-slice token).

    A kernel pod talks to the jupyter server that started it through the same client (its
    own routes at ``prefix=""``), so both read refusals the same way (:func:`error_from`);
    ``unreachable`` words the sentence for a peer that does not answer.
    """

    def __init__(
        self,
        url: str,
        *,
        hub_token: str | None = None,
        timeout: float = CALL_TIMEOUT,
        prefix: str = API_PREFIX,
        unreachable: str = "the GPU broker at {url} is not reachable: {why}",
    ) -> None:
        self.address = BrokerAddress(url, prefix)
        self._unreachable = unreachable
        self.url = url
        self.timeout = timeout
        # Over HTTP the hub's word on the caller's token is the identity; the socket needs none.
        self.hub_token = hub_token if hub_token is not None else os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.on_change: Callable[[], None] | None = None  # told after every call that changes

    def unreachable(self, error: BaseException) -> UnreachableError:
        path = self.address.socket_path
        why = (
            socket_refusal(path) if path and isinstance(error, (PermissionError, FileNotFoundError)) else None
        )
        return UnreachableError(self._unreachable.format(url=self.url, why=why or error))

    def headers(self, token: str | None = None) -> dict[str, str]:
        """Who we are (over HTTP: our hub token) and where we run; a kernel adds its token."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            HOST_HEADER: socket.gethostname(),
        }
        if self.hub_token and self.address.socket_path is None:
            headers["Authorization"] = f"token {self.hub_token}"
        if token:
            headers[TOKEN_HEADER] = token
        return headers

    def events(self, route: str, timeout: float) -> Iterator[Any]:
        """The events of a server-sent-events route as parsed JSON (None for a keep-alive line),
        until the broker ends the stream; raises :class:`UnreachableError` when it breaks.
        ``timeout`` bounds the wait for any line: the broker sends one at least that often."""
        connection = self.address.connection(timeout)
        try:
            connection.request("GET", self.address.path(route), headers=self.headers())
            response = connection.getresponse()
            if response.status >= 400:
                text = response.read()
                raise error_from(json.loads(text) if text else None, response.status)
            data: list[str] = []
            for raw in response:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if line.startswith(":"):
                    yield None
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif not line and data:
                    yield json.loads("".join(data))
                    data = []
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise self.unreachable(error) from None
        finally:
            connection.close()

    def call(
        self,
        method: str,
        route: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The broker's JSON answer to one request; raises its refusal as a domain error, or
        :class:`UnreachableError`."""
        headers = self.headers(token)
        data = json.dumps(body).encode() if body is not None else None
        connection = self.address.connection(timeout or self.timeout)
        try:
            connection.request(method, self.address.path(route), body=data, headers=headers)
            response = connection.getresponse()
            status, text = response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            raise self.unreachable(error) from None
        finally:
            connection.close()
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = {"message": text.decode(errors="replace")[:500]}
        if self.on_change is not None and method != "GET" and (method, route) not in READING:
            self.on_change()
        if status >= 400:
            raise error_from(answer, status)
        return answer


__all__ = [
    "API_PREFIX",
    "HOST_HEADER",
    "TOKEN_HEADER",
    "BrokerAddress",
    "BrokerClient",
    "SocketRefusal",
    "UnreachableError",
    "error_from",
    "error_payload",
    "refusal_on_the_way",
    "register_error",
    "socket_refusal",
]
