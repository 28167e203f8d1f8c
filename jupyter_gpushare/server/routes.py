"""REST routes under ``{base_url}api/gpushare/`` (docs/reference/rest-api.md) for the server's users.

Every route is behind jupyter_server's authentication and authorization (resource
``gpushare``); mutations get the server's usual XSRF check. Handlers parse, call the context and
write: bad input is a 4xx with ``{"message": ...}`` and changes nothing, and a refusal's status
comes from its type (:mod:`jupyter_gpushare.http_errors`), carrying the same sentence the magic
and the log show.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_gpushare.core import request_body
from jupyter_gpushare.core.errors import GPUShareError
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.http_errors import answering_domain_errors, message_of
from jupyter_gpushare.server.content_coding import accepts_gzip
from jupyter_gpushare.server.context import GPUShareContext
from jupyter_gpushare.server.snapshots import Answer, Body

AUTH_RESOURCE = "gpushare"
REQUEST_FIELDS = ("gpu_memory", "gpu_mode", "gpu_cores")


class GPUShareHandler(APIHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE

    @property
    def gpushare(self) -> GPUShareContext:
        return self.settings["gpushare"]  # type: ignore[no-any-return]

    def write_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    async def write_body(self, answer: Answer) -> None:
        """A body rendered once per change (or the error the route answers with instead): its
        bytes as they are, or compressed once per change for a client that accepts gzip, and
        the ETag computed with them."""
        if not isinstance(answer, Body):
            raise answer
        self.set_header("Content-Type", "application/json")
        self.set_header("Vary", "Accept-Encoding")
        gzipped = None
        if accepts_gzip(self.request.headers.get("Accept-Encoding")):
            # The first request after a change compresses (a 1,000-slice list: milliseconds)
            # off the event loop, as the snapshot itself was built.
            gzipped = answer.gzipped() if answer.gzip_ready else await asyncio.to_thread(answer.gzipped)
        if gzipped is None:
            self._etag = answer.etag
            self.finish(answer.data)
            return
        data, self._etag = gzipped
        self.set_header("Content-Encoding", "gzip")
        self.finish(data)

    def compute_etag(self) -> str | None:
        etag: str | None = getattr(self, "_etag", None)
        return etag if etag is not None else super().compute_etag()  # type: ignore[no-any-return]

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object, or a 400 that says what is wrong with it."""
        return request_body.json_object(self.request.body or b"")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Never a traceback, never a 500 for our refusals: the reason, as a sentence.
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message_of(error, status_code)}))


def request_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The slice fields of a body, type-checked (values are checked by the backend)."""
    fields: dict[str, Any] = {}
    for name in REQUEST_FIELDS:
        if name not in body or body[name] is None:
            continue
        value = body[name]
        allowed: tuple[type, ...] = (str, int) if name != "gpu_mode" else (str,)
        if isinstance(value, bool) or not isinstance(value, allowed):
            kinds = "a string or a whole number" if name != "gpu_mode" else "a string"
            raise web.HTTPError(400, f"{name} must be {kinds}, not {json.dumps(value)}")
        fields[name] = value
    return fields


class PoolHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        await self.write_body((await self.gpushare.snapshots.current()).pool)


class KernelsHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        await self.write_body((await self.gpushare.snapshots.current()).kernels)

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def post(self) -> None:
        body = self.json_body()
        for name, limit in (("name", request_body.MAX_NAME_BYTES), ("path", request_body.MAX_PATH_BYTES)):
            if body.get(name) is not None:
                request_body.check_label(name, body[name], limit)
        view, started = await self.gpushare.start_kernel(
            body.get("name") or None, body.get("path") or "", request_fields(body)
        )
        self.write_json(view, status=201 if started else 202)


class KernelHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        self.write_json(await asyncio.to_thread(self.gpushare.kernel_view, kernel_id))

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def patch(self, kernel_id: str) -> None:
        body = self.json_body()
        unknown = set(body) - {"gpu_memory", "restart", "force"}
        if unknown:
            raise web.HTTPError(400, f"only gpu_memory can be changed, not {', '.join(sorted(unknown))}")
        if "gpu_memory" not in body:
            raise web.HTTPError(400, 'send {"gpu_memory": SIZE} to resize the slice')
        restart, force = body.get("restart", False), body.get("force", False)
        for name, value in (("restart", restart), ("force", force)):
            if not isinstance(value, bool):
                raise web.HTTPError(400, f"{name} must be true or false, not {json.dumps(value)}")
        fields = request_fields(body)
        if "gpu_memory" not in fields:
            raise web.HTTPError(400, 'gpu_memory must be a size such as "8G", not null')
        await self.gpushare.resize(kernel_id, fields["gpu_memory"], restart, force)
        self.write_json(await asyncio.to_thread(self.gpushare.kernel_view, kernel_id))


class KernelGPUHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def delete(self, kernel_id: str) -> None:
        await self.gpushare.release(kernel_id)
        self.set_status(204)
        self.finish()


class KernelStateHandler(GPUShareHandler):
    """``POST kernels/{id}/suspend`` and ``POST kernels/{id}/resume`` (no body, or ``{}``): one
    subclass per route, so each route is a path of its own in the OpenAPI document."""

    action = ""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        if (self.request.body or b"").strip():
            body = self.json_body()
            if body:
                raise web.HTTPError(400, f"{self.action} takes no fields, not {', '.join(sorted(body))}")
        if self.action == "suspend":
            await self.gpushare.suspend(kernel_id)
        else:
            await self.gpushare.resume(kernel_id)
        self.write_json(await asyncio.to_thread(self.gpushare.kernel_view, kernel_id))


class KernelSuspendHandler(KernelStateHandler):
    action = "suspend"


class KernelResumeHandler(KernelStateHandler):
    action = "resume"


class StreamHandler(GPUShareHandler):
    """Server-sent events: ``event: usage`` with ``{"pool", "kernels"}``, one per sample."""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # proxies must not hold events back
        hub = self.gpushare.hub
        queue = hub.subscribe()
        self._closed = asyncio.Event()
        try:
            self.write("retry: 2000\n\n")
            await self.flush()
            while not self._closed.is_set():
                getter = asyncio.ensure_future(queue.get())
                closed = asyncio.ensure_future(self._closed.wait())
                done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
                closed.cancel()
                if getter not in done:
                    getter.cancel()
                    break
                self.write(getter.result())
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            hub.unsubscribe(queue)

    def on_connection_close(self) -> None:
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()


class ConfigHandler(GPUShareHandler):
    """What the JupyterLab size picker offers: the presets, the defaults, the pool's modes."""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        backend = self.gpushare.backend
        settings = backend.settings
        self.write_json(
            {
                "sizes": list(settings.sizes),
                "default_memory": settings.default_memory,
                "default_mode": settings.default_mode,
                "modes": await asyncio.to_thread(backend.modes),
            }
        )


class FitHandler(GPUShareHandler):
    """``GET fit?gpu_memory=SIZE[&gpu_memory=SIZE…][&gpu_mode=M][&gpu_cores=N]``: what starting
    a kernel of each size would do now, in the order asked (the start picker's annotations).
    Nothing is reserved; a size that cannot be read is a 400, as ``POST kernels`` answers it."""

    MAX_SIZES = 32

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        # Other parameters are left alone: JupyterLab adds a cache-busting one to every GET.
        sizes = self.get_arguments("gpu_memory")
        if not sizes:
            raise web.HTTPError(400, "ask with ?gpu_memory=SIZE (one or more times)")
        if len(sizes) > self.MAX_SIZES:
            raise web.HTTPError(400, f"at most {self.MAX_SIZES} sizes at once, not {len(sizes)}")
        mode, cores = (self._single(name) for name in ("gpu_mode", "gpu_cores"))
        context = self.gpushare

        def answer() -> list[dict[str, Any]]:
            return [context.preview(size, mode, cores).as_json(size) for size in sizes]

        self.write_json(await asyncio.to_thread(answer))

    def _single(self, name: str) -> str | None:
        values = self.get_arguments(name)
        if len(values) > 1:
            raise web.HTTPError(400, f"{name} may be given once, not {len(values)} times")
        return values[0] if values else None


class ModesHandler(GPUShareHandler):
    """``GET modes``: every installed mode, what enforces it, whether a running kernel's slice
    can be resized in place, and whether this pool can honour it now (and why not: the sentence
    a start would be refused with)."""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    @answering_domain_errors
    async def get(self) -> None:
        context = self.gpushare

        def why_not(name: str) -> str:
            try:
                reason = context.preview(None, name, None).reason
            except GPUShareError as refusal:
                reason = str(refusal)
            return reason or f"this pool cannot hold a kernel in mode {name!r} now"

        def answer() -> list[dict[str, Any]]:
            offered = set(context.backend.modes())
            return [
                {
                    "name": name,
                    "enforcement": mode.enforcement,
                    "live_resize": mode.live_resize,
                    "available": name in offered,
                    "reason": None if name in offered else why_not(name),
                }
                for name, mode in MODES.items()
            ]

        self.write_json(await asyncio.to_thread(answer))


class OpenAPIHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.finish(self.gpushare.openapi_text(), set_content_type="application/yaml")


__all__ = [
    "ConfigHandler",
    "FitHandler",
    "KernelGPUHandler",
    "KernelHandler",
    "KernelResumeHandler",
    "KernelStateHandler",
    "KernelSuspendHandler",
    "KernelsHandler",
    "ModesHandler",
    "OpenAPIHandler",
    "PoolHandler",
    "StreamHandler",
    "request_fields",
]
