"""Who is calling the broker: the identity comes from the broker's side of the wire, never from
what the caller says of itself.

* Unix socket: the peer's credentials (``SO_PEERCRED``: pid, uid, gid), which the kernel fills
  in for the connecting process. The user is the uid's login name; the calling process (pid and
  start time) holds what it asks for, so a request dies with the process that made it.
* HTTP: the JupyterHub user of the presented API token, as the hub answers through JupyterHub's
  own service auth (``HubAuth.user_for_token``); the broker is a JupyterHub service.

Admins see and act on every kernel: root and the broker's own user on the socket, hub admins
(or a token with the ``admin:users`` scope) over HTTP, and anyone in ``admin_users``.
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.keys import server_id_of
from jupyter_gpushare.backends.processes import identify
from jupyter_gpushare.core.errors import NotAuthenticatedError, TokenRefusedError
from jupyter_gpushare.core.records import ProcessIdentity
from jupyter_gpushare.core.visibility import EVERYONE

HUB_CACHE_SECONDS = 30.0  # how long the hub's answer for a token is reused (a revoked one: this long)
ADMIN_SCOPES = frozenset({"admin:users", "admin:servers"})


@dataclass(frozen=True)
class Caller:
    """One caller of the broker, as the broker established it."""

    user: str
    admin: bool = False
    process: ProcessIdentity | None = None  # the calling process (Unix socket only)
    uid: int | None = None  # its OS user (Unix socket only)
    host: str = ""  # where its server runs, as it says (HTTP: names its kernel pods' server)
    groups: tuple[str, ...] = ()  # its JupyterHub groups (HTTP), for the accounting by group

    @property
    def viewer(self) -> str:
        """Whose kernels this caller sees in full: their own, or everyone's for an admin."""
        return EVERYONE if self.admin else self.user

    @property
    def server_id(self) -> str:
        """The id of the caller's server: its process on this node, or its host in a cluster."""
        if self.process is not None:
            return server_id_of(self.user, self.process.pid)
        return f"{self.user}@{self.host or 'unknown'}"

    def may_act_on(self, owner: str) -> bool:
        return self.admin or owner == self.user


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (Linux)."""
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size))
    return pid, uid, gid


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"  # a user without a passwd entry (a container's): still one identity


def socket_caller(sock: socket.socket, admin_users: frozenset[str]) -> Caller:
    """The caller at the other end of the broker's Unix socket."""
    pid, uid, _ = peer_credentials(sock)
    name = user_name(uid)
    admin = uid in (0, os.geteuid()) or name in admin_users
    return Caller(user=name, admin=admin, process=identify(pid), uid=uid)


class HubIdentity:
    """Callers over HTTP, identified by the hub from their API token."""

    def __init__(self, admin_users: frozenset[str], auth: Any = None) -> None:
        self.admin_users = admin_users
        self._auth = auth

    @property
    def auth(self) -> Any:
        """JupyterHub's ``HubAuth``, configured from the service environment the hub gives
        (``$JUPYTERHUB_API_URL``, ``$JUPYTERHUB_API_TOKEN``)."""
        if self._auth is None:
            from jupyterhub.services.auth import HubAuth

            self._auth = HubAuth(cache_max_age=HUB_CACHE_SECONDS)
        return self._auth

    async def caller(self, authorization: str, host: str) -> Caller:
        """The hub user of ``Authorization: token …``; 401 without one, 403 for one the hub
        does not accept."""
        match = self.auth.auth_header_pat.match(authorization or "")
        if not match:
            raise NotAuthenticatedError(
                "the GPU broker needs a JupyterHub API token (Authorization: token …); a "
                "single-user server sends its own $JUPYTERHUB_API_TOKEN"
            )
        model = await self.auth.user_for_token(match.group(1), sync=False)
        if not model:
            raise TokenRefusedError(
                "the hub does not accept this API token (unknown, expired or revoked): the GPU "
                "broker cannot tell who you are"
            )
        if model.get("kind", "user") != "user":
            raise TokenRefusedError("only a JupyterHub user's token can use the GPU broker, not a service's")
        name = str(model["name"])
        scopes = set(model.get("scopes") or ())
        admin = bool(model.get("admin")) or bool(scopes & ADMIN_SCOPES) or name in self.admin_users
        groups = tuple(str(group) for group in model.get("groups") or () if isinstance(group, str))
        return Caller(user=name, admin=admin, host=host, groups=groups)


__all__ = ["Caller", "HubIdentity", "peer_credentials", "socket_caller", "user_name"]
