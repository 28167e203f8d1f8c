"""The broker's routes of the accounting: ``GET usage``, ``GET usage/totals`` (every backend: a
backend without accounting says so) and ``POST slices/{id}/activity`` (local kernels' reports of
their cells, proved by the kernel's own token).

The caller sees their own figures, an admin everyone's: the scoped backend decides, as for every
other view (:mod:`.authority`).
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from ..backends.transport import TOKEN_HEADER
from ..errors import InvalidRequestError
from ..http_errors import answering_domain_errors
from ..usage_report import usage_query
from .authority import LocalAuthority
from .handlers import KERNEL, BrokerHandler

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


class UsageHandler(BrokerHandler):
    """``GET usage?since=7d&by=user|group|kernel``."""

    @answering_domain_errors
    async def get(self) -> None:
        since, by = usage_query(self.get_arguments)
        self.answer(await self.run(self.scoped().usage, since, by))


class UsageTotalsHandler(BrokerHandler):
    """``GET usage/totals``: each user's figures since accounting began."""

    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.scoped().usage_totals))


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


ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("usage", UsageHandler),
    ("usage/totals", UsageTotalsHandler),
]
LOCAL_ROUTES: list[tuple[str, type[BrokerHandler]]] = [(f"slices/{KERNEL}/activity", ActivityHandler)]

__all__ = ["LOCAL_ROUTES", "ROUTES", "activity_report"]
