"""``GET api/gpushare/usage``: what the user's kernels reserved and used (docs/admins/accounting.md).

The backend answers for the server's user (through a broker, for the user the broker identified;
everyone for its admins). Behind jupyter_server's authentication and authorization like every
other route; bad parameters are a 400 with the sentence, never a 500.
"""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpushare.core.accounting.usage_report import usage_query
from jupyter_gpushare.http_errors import answering_domain_errors
from jupyter_gpushare.server.routes import GPUShareHandler


class UsageHandler(GPUShareHandler):
    """``GET usage?since=7d&by=user|group|kernel``: the report, with each user's series of
    reserved and used memory (the panel's Usage chart)."""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        since, by = usage_query(self.get_arguments)
        self.write_json(await asyncio.to_thread(self.gpushare.backend.usage, since, by))


__all__ = ["UsageHandler"]
