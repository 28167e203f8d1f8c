"""Who calls the broker: from the socket's peer credentials, or from the hub's word on a token —
never from what the caller says of itself."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from jupyter_gpushare.backends.broker_base.identity import (
    Caller,
    HubIdentity,
    peer_credentials,
    socket_caller,
    user_name,
)
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.core.errors import NotAuthenticatedError, TokenRefusedError
from jupyter_gpushare.core.visibility import EVERYONE


def test_the_peer_of_a_unix_socket_is_this_process() -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, theirs:
        assert peer_credentials(mine) == (os.getpid(), os.getuid(), os.getgid())
        caller = socket_caller(mine, frozenset())
    assert caller.user == user_name(os.getuid()) and caller.uid == os.getuid()
    assert caller.process == current_process()
    assert caller.admin == (os.getuid() in (0, os.geteuid()))  # root, or the broker's own user
    assert caller.server_id.startswith(f"{caller.user}@") and caller.server_id.endswith(f":{os.getpid()}")


def test_an_admin_sees_everyone_a_user_themselves() -> None:
    assert Caller("alice").viewer == "alice" and Caller("root", admin=True).viewer == EVERYONE
    assert Caller("alice").may_act_on("alice") and not Caller("alice").may_act_on("bob")
    assert Caller("root", admin=True).may_act_on("bob")
    assert Caller("alice", host="jupyter-alice").server_id == "alice@jupyter-alice"


class HubAnswers:
    """JupyterHub's HubAuth at the edge: answers ``user_for_token`` as the hub would."""

    auth_header_pat = __import__("re").compile(r"(?:token|bearer)\s+(.+)", __import__("re").IGNORECASE)

    def __init__(self, models: dict[str, Any]) -> None:
        self.models = models

    async def user_for_token(self, token: str, sync: bool = True) -> Any:
        return self.models.get(token)


@pytest.mark.parametrize(
    ("model", "admin"),
    [
        ({"kind": "user", "name": "alice", "scopes": ["access:servers!user=alice"]}, False),
        ({"kind": "user", "name": "ada", "admin": True}, True),
        ({"kind": "user", "name": "ops", "scopes": ["admin:users"]}, True),
        ({"kind": "user", "name": "carol"}, True),  # in admin_users
    ],
)
async def test_a_hub_user_is_who_the_hub_says(model: dict[str, Any], admin: bool) -> None:
    identity = HubIdentity(frozenset({"carol"}), HubAnswers({"t": model}))
    caller = await identity.caller("token t", "jupyter-x")
    assert (caller.user, caller.admin, caller.host) == (model["name"], admin, "jupyter-x")


async def test_no_token_an_unknown_one_and_a_services_are_refused() -> None:
    identity = HubIdentity(frozenset(), HubAnswers({"svc": {"kind": "service", "name": "x"}}))
    with pytest.raises(NotAuthenticatedError):
        await identity.caller("", "")
    with pytest.raises(TokenRefusedError, match="expired"):
        await identity.caller("token nope", "")
    with pytest.raises(TokenRefusedError, match="service"):
        await identity.caller("Bearer svc", "")
