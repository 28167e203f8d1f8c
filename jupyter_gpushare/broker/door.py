"""The broker's door: how many connections a user may hold open, how long one may sit idle, and
what happens when the process runs out of file descriptors.

Every user of a team box can connect to the broker's socket, and each connection costs the broker
a file descriptor. Without limits one user holding a thousand idle connections would use up the
broker's descriptors, and every other user's start would then fail. So:

* each OS user (the socket's peer credentials) may hold ``max_connections_per_user`` connections
  at once; one more is answered ``503`` with the reason and closed at once;
* a connection that sends no request (or no complete one) for ``idle_timeout`` seconds is closed;
* at start the soft limit of open files is raised to the hard limit (systemd's default soft limit
  is 1024);
* should the process still run out of descriptors, the pending connection is accepted on a
  descriptor kept in reserve and closed, so the broker never spins on a socket it cannot accept
  from, and the fault is logged at most once every ``LOG_EVERY`` seconds with a count.

HTTP callers (JupyterHub users, through the network) are bounded by the idle timeout only: their
identity is their hub token, known only once a request has been read.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

from jupyter_gpushare.backends.broker_base.handler import DRAIN_BODY_BYTES
from jupyter_gpushare.backends.broker_base.identity import peer_credentials, user_name
from jupyter_gpushare.backends.broker_client.transport import error_payload
from jupyter_gpushare.core.errors import BackendUnavailableError
from jupyter_gpushare.core.request_body import MAX_HEADER_BYTES

log = logging.getLogger("jupyter_gpushare.broker")

LOG_EVERY = 10.0  # seconds: one line per kind of refusal at most, with how many there were
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# How much of a request's headers too large for any route is still read (the body's:
# DRAIN_BODY_BYTES, which the routes share), so that its sender can read the 431 that says so.
DRAIN_HEADER_BYTES = max(1024 * 1024, 4 * MAX_HEADER_BYTES)


class Throttled:
    """Log lines of one kind at most once every ``every`` seconds, saying how many were held back."""

    def __init__(self, every: float = LOG_EVERY) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def warning(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.every) < self.every:
            self._held[kind] += 1
            return
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more like it in the last {self.every:g} s)" if held else ""
        log.warning(message + suffix, *args)


class Door:
    """Who holds how many connections, and the descriptor kept in reserve."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self.open: Counter[int] = Counter()  # connections by the peer's uid (Unix socket)
        self.throttled = Throttled()
        self._reserve: int | None = _reserve()

    def admit(self, uid: int) -> bool:
        if self.open[uid] >= self.per_user:
            return False
        self.open[uid] += 1
        return True

    def leave(self, uid: int) -> None:
        self.open[uid] -= 1
        if self.open[uid] <= 0:
            del self.open[uid]

    def refusal(self, uid: int) -> bytes:
        """The answer to a connection beyond the user's share: a 503 that says why."""
        name = user_name(uid)
        message = (
            f"the GPU broker takes no more than {self.per_user} connections from user {name} at once "
            "(GPUShareBroker.max_connections_per_user): close some, or wait for them to end"
        )
        self.throttled.warning(
            f"share {uid}",
            "refused a connection: more than %d connections from user %s at once",
            self.per_user,
            name,
        )
        body = json.dumps(error_payload(BackendUnavailableError(message))).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + body

    def out_of_descriptors(self, listener: socket.socket, error: OSError) -> None:
        """Accept the pending connection on the reserved descriptor and close it at once: the
        caller is told at once instead of waiting, and the listening socket stops being ready."""
        self.throttled.warning(
            "descriptors",
            "the GPU broker has no file descriptor left (%s): it closes new connections until "
            "some end; raise its limit (LimitNOFILE= in its systemd unit) or lower "
            "GPUShareBroker.max_connections_per_user",
            error.strerror or error,
        )
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        try:
            connection, _ = socket.socket.accept(listener)
            connection.close()
        except OSError:
            pass
        finally:
            self._reserve = _reserve()


def _reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


class GuardedListener(socket.socket):
    """A listening socket whose ``accept`` survives the process running out of descriptors."""

    door: Door

    def accept(self) -> tuple[socket.socket, Any]:
        try:
            return super().accept()
        except OSError as error:
            if error.errno not in OUT_OF_DESCRIPTORS:
                raise
            self.door.out_of_descriptors(self, error)
            # Nothing was accepted for the server: it waits for the socket to be ready again.
            raise BlockingIOError(errno.EAGAIN, "no connection accepted") from None


def guarded(sock: socket.socket, door: Door) -> GuardedListener:
    listener = GuardedListener(sock.family, sock.type, sock.proto, fileno=sock.detach())
    listener.door = door
    return listener


class BrokerServer(HTTPServer):
    """The broker's HTTP server: tornado's, with the door's limits on connections."""

    def initialize(self, *args: Any, door: Door, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(*args, **kwargs)
        self.door = door
        self._peers: dict[IOStream, int] = {}

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        super().add_sockets([guarded(sock, self.door) for sock in sockets])

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        uid = _peer_uid(stream.socket)
        if uid is not None:
            if not self.door.admit(uid):
                stream.write(self.door.refusal(uid)).add_done_callback(lambda sent: _close(stream, sent))
                return
            self._peers[stream] = uid
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        uid = self._peers.pop(getattr(server_conn, "stream", None), None)  # type: ignore[arg-type]
        if uid is not None:
            self.door.leave(uid)
        super().on_close(server_conn)


def _close(stream: IOStream, sent: Any) -> None:
    if not sent.cancelled():
        sent.exception()  # a peer gone before the answer: nothing to tell it
    stream.close()


def _peer_uid(sock: socket.socket | None) -> int | None:
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        return peer_credentials(sock)[1]
    except OSError:
        return None


def broker_server(application: Any, per_user: int, idle_timeout: float) -> BrokerServer:
    return BrokerServer(
        application,
        door=Door(per_user),
        idle_connection_timeout=idle_timeout,
        body_timeout=idle_timeout,
        max_body_size=DRAIN_BODY_BYTES,
        max_header_size=DRAIN_HEADER_BYTES,
    )


def raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard one (each connection holds one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1024 * 1024
    if soft != resource.RLIM_INFINITY and soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as error:
        log.warning("the GPU broker could not raise its open files limit from %d: %s", soft, error)
        return
    log.info("open files limit raised from %d to %d", soft, wanted)


__all__ = ["BrokerServer", "Door", "broker_server", "raise_open_files_limit"]
