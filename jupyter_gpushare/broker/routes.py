"""The broker's routes of the service API, under ``/api/gpushare/broker/``, for every backend.

Each request is identified before anything else (its base,
:class:`~jupyter_gpushare.backends.broker_base.handler.BrokerHandler`, which every kind's routes
share too): a caller the broker cannot identify gets 401, a token the hub refuses 403, and nothing
is read or changed. Requests are read by the same rules as the REST API's
(:mod:`jupyter_gpushare.core.request_body`): headers and a body within their limits (431, 413:
answered, the rest of a large body read and dropped), JSON no deeper than 32 levels, text only,
names and paths without control characters, kernel ids that are UUIDs; then field by field. Bad
input is a 4xx ``{"message", "error"}`` and changes nothing. Domain errors answer with their type's
status and carry their type's name, so the client raises the same error an embedded backend would
(:mod:`jupyter_gpushare.backends.broker_client.transport`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
from typing import Any

from tornado import web

from jupyter_gpushare.backends.broker_base.authority import require_own
from jupyter_gpushare.backends.broker_base.handler import (
    KERNEL,
    BrokerHandler,
    kernel_id_field,
    request_fields,
)
from jupyter_gpushare.backends.broker_client.wire import server_kernels_from_json
from jupyter_gpushare.broker import stream
from jupyter_gpushare.broker.stream import broker_marker
from jupyter_gpushare.core.capabilities import through_a_broker
from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.http_errors import answering_domain_errors

log = logging.getLogger("jupyter_gpushare.broker")


def package_version() -> str:
    try:
        return importlib.metadata.version("jupyter-gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---- checking bodies ---------------------------------------------------------------------------


def usage_report(body: dict[str, Any]) -> UsageReport:
    used, utilization = body.get("memory_used"), body.get("utilization")
    source = body.get("source", "kernel")
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise InvalidRequestError(f"memory_used must be a whole number of bytes, not {json.dumps(used)}")
    if utilization is not None and (
        isinstance(utilization, bool) or not isinstance(utilization, int) or not 0 <= utilization <= 100
    ):
        raise InvalidRequestError(f"utilization must be 0-100 or null, not {json.dumps(utilization)}")
    if source not in ("kernel", "simulated"):
        raise InvalidRequestError(f'source must be "kernel" or "simulated", not {json.dumps(source)}')
    return UsageReport(used, utilization, source)


# ---- the routes every broker serves ------------------------------------------------------------


class InfoHandler(BrokerHandler):
    """``GET info``: which backend, who the broker says the caller is, and what it offers its
    clients' kernels (its backend's capabilities, less what its routes do not carry)."""

    @answering_domain_errors
    async def get(self) -> None:
        backend = self.authority.backend
        self.answer(
            {
                "backend": backend.name,
                "remote_kernels": backend.remote_kernels,
                "capabilities": through_a_broker(backend.capabilities).to_wire(),
                "user": self.caller.user,
                "admin": self.caller.admin,
                "location": await self.run(backend.location),
                "version": package_version(),
            }
        )


class PoolHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.scoped().pool))


class KernelsHandler(BrokerHandler):
    """``GET kernels``: every slice, others' anonymous (``status``, metrics)."""

    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.scoped().all_kernels))


class ServerKernelsHandler(BrokerHandler):
    """``POST server-kernels`` ``{"kernels": <what the server knows of its kernels>}``: the
    server's ``GET kernels``, described by the backend for that server."""

    @answering_domain_errors
    async def post(self) -> None:
        try:
            known = server_kernels_from_json(self.json_body().get("kernels", {}))
        except ValueError as error:
            raise InvalidRequestError(str(error)) from None
        self.answer(await self.run(self.scoped().kernels, known))


class MarkerHandler(BrokerHandler):
    """``GET marker``: changes whenever the pool or any kernel may look different."""

    @answering_domain_errors
    async def get(self) -> None:
        self.answer({"marker": await broker_marker(self.authority.backend)})


class ModesHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self) -> None:
        self.answer(await self.run(self.authority.backend.modes))


class CheckHandler(BrokerHandler):
    """``POST check``: the request as the broker resolves it, or why it can never start."""

    @answering_domain_errors
    async def post(self) -> None:
        body = self.json_body()
        memory, mode, cores = request_fields(body)
        kernel_id = kernel_id_field(body)
        request = await self.run(self.scoped().check, memory, mode, cores, kernel_id)
        self.answer({"size": request.size.text, "mode": request.mode.name, "cores": request.cores})


class PreviewHandler(BrokerHandler):
    """``POST preview``: what a start of this request would do now, for the caller (``GET fit``)."""

    @answering_domain_errors
    async def post(self) -> None:
        memory, mode, cores = request_fields(self.json_body())
        preview = await self.run(self.scoped().preview, memory, mode, cores)
        self.answer(dataclasses.asdict(preview))


class AccessHandler(BrokerHandler):
    """``GET access``: 200 when the broker can read its pool; its fault otherwise."""

    @answering_domain_errors
    async def get(self) -> None:
        await self.run(self.authority.backend.check_access)
        self.answer({})


class RefreshHandler(BrokerHandler):
    @answering_domain_errors
    async def post(self) -> None:
        await self.run(self.authority.backend.refresh)
        self.answer({})


class ReconcileHandler(BrokerHandler):
    """``POST reconcile``: release dead kernels' slices now (``status`` does this first)."""

    @answering_domain_errors
    async def post(self) -> None:
        await self.run(self.authority.housekeeping)
        self.answer({})


class WaitingHandler(BrokerHandler):
    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        self.answer({"waiting": await self.run(self.scoped().is_waiting, kernel_id)})


class KernelUsageHandler(BrokerHandler):
    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        report = usage_report(self.json_body())
        await self.run(require_own, self.authority, self.caller, kernel_id)
        await self.run(self.scoped().report_usage, kernel_id, report)
        self.answer({})


class NotFoundHandler(BrokerHandler):
    """Any other path: a 404 in the broker's JSON."""

    async def prepare(self) -> None:
        await super().prepare()
        raise web.HTTPError(404, f"the GPU broker has no route {self.request.path}")


ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("info", InfoHandler),
    ("pool", PoolHandler),
    ("kernels", KernelsHandler),
    ("server-kernels", ServerKernelsHandler),
    ("marker", MarkerHandler),
    ("stream", stream.StreamHandler),
    ("modes", ModesHandler),
    ("check", CheckHandler),
    ("preview", PreviewHandler),
    ("access", AccessHandler),
    ("refresh", RefreshHandler),
    ("reconcile", ReconcileHandler),
    (f"slices/{KERNEL}/waiting", WaitingHandler),
    (f"slices/{KERNEL}/usage", KernelUsageHandler),
]

__all__ = [
    "ROUTES",
    "NotFoundHandler",
    "usage_report",
]
