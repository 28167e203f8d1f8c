"""The broker's routes of the accounting: ``GET usage``, ``GET usage/totals`` (every backend: a
backend without accounting says so). (Local kernels' reports of their cells are the local kind's
route: :mod:`jupyter_gpushare.backends.local.broker.activity_routes`.)

The caller sees their own figures, an admin everyone's: the scoped backend decides, as for every
other view (:mod:`jupyter_gpushare.backends.broker_base.authority`).
"""

from __future__ import annotations

from jupyter_gpushare.backends.broker_base.handler import BrokerHandler
from jupyter_gpushare.core.accounting.usage_report import usage_query
from jupyter_gpushare.http_errors import answering_domain_errors


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


ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("usage", UsageHandler),
    ("usage/totals", UsageTotalsHandler),
]

__all__ = ["ROUTES"]
