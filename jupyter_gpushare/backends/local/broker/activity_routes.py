"""The broker's route of local kernels' reports of their cells: ``POST slices/{id}/activity``
``{"busy", "at", "idle_after", "idle_action"}``, proved by the kernel's own token (the node
ledger's accounting and its idle rules act on them)."""

from __future__ import annotations

import json
import time
from typing import Any, cast

from jupyter_gpushare.backends.broker_base.handler import KERNEL, BrokerHandler
from jupyter_gpushare.backends.broker_client.transport import TOKEN_HEADER
from jupyter_gpushare.backends.local.broker.authority import LocalAuthority
from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.http_errors import answering_domain_errors

CLOCK_SLACK = 3600.0  # seconds a kernel's report of its cells may lie in the past


def activity_report(body: dict[str, Any], now: float) -> tuple[bool, float, float, str]:
    """``(busy, at, idle_after, idle_action)`` of a kernel's report, checked."""
    busy, at = body.get("busy"), body.get("at")
    idle_after, action = body.get("idle_after", 0), body.get("idle_action", "suspend")
    if not isinstance(busy, bool):
        raise InvalidRequestError(f"busy must be true or false, not {json.dumps(busy)}")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not now - CLOCK_SLACK <= at <= now + 60:
        raise InvalidRequestError(
            "at must be the time of the change in seconds since the epoch, within the last hour, "
            f"not {json.dumps(at)}"
        )
    if isinstance(idle_after, bool) or not isinstance(idle_after, (int, float)) or not 0 <= idle_after < 1e9:
        raise InvalidRequestError(f"idle_after must be a number of seconds, not {json.dumps(idle_after)}")
    if action not in ("suspend", "release"):
        raise InvalidRequestError(f'idle_action must be "suspend" or "release", not {json.dumps(action)}')
    return busy, float(at), float(idle_after), str(action)


class ActivityHandler(BrokerHandler):
    """``POST slices/{id}/activity`` ``{"busy", "at", "idle_after", "idle_action"}`` with the
    kernel's token: a local kernel's cell started or ended."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        busy, at, idle_after, action = activity_report(self.json_body(), time.time())
        token = self.request.headers.get(TOKEN_HEADER) or None
        local = cast(LocalAuthority, self.authority).local
        await self.run(local.note_activity, kernel_id, token, busy, at, idle_after, action)
        self.answer({})


ROUTES: list[tuple[str, type[BrokerHandler]]] = [(f"slices/{KERNEL}/activity", ActivityHandler)]

__all__ = ["ROUTES", "activity_report"]
