"""The broker's route of local kernels' reports of their cells: ``POST slices/{id}/activity``
``{"busy", "at", "idle_after", "idle_action"}``, proved by the kernel's own token (the node
ledger's accounting and its idle rules act on them)."""

from __future__ import annotations

import time
from typing import cast

from jupyter_gpushare.backends.broker_base.handler import KERNEL, BrokerHandler
from jupyter_gpushare.backends.broker_client.transport import TOKEN_HEADER
from jupyter_gpushare.backends.local.broker.authority import LocalAuthority
from jupyter_gpushare.core.request_body import activity_report
from jupyter_gpushare.http_errors import answering_domain_errors


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

__all__ = ["ROUTES"]
