"""REST routes under ``{base_url}api/gpushare/`` (SPEC §7).

Every route is behind jupyter_server's authentication and authorization (resource
``gpushare``); mutations get the server's usual XSRF check. Bad input is a 4xx with
``{"message": ...}`` and changes nothing; a refusal carries the same sentence the magic and the
log show.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from jupyter_client.kernelspec import NoSuchKernel
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import GPUShareError
from ..modes import MODES
from .context import GPUShareContext
from .starts import Start

AUTH_RESOURCE = "gpushare"
START_ANSWER_WITHIN = 1.0  # seconds POST kernels waits before answering "queued"
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

    def write_raw(self, text: str) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(text)

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object, or a 400 that says what is wrong with it."""
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the request body must be a JSON object")
        return body

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Never a traceback, never a 500 for our refusals: the reason, as a sentence.
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        if isinstance(error, (GPUShareError, web.HTTPError)) and error.log_message:
            message = str(error) if isinstance(error, GPUShareError) else error.log_message
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


def _request_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The slice fields of a body, type-checked (values are checked by the service)."""
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
    async def get(self) -> None:
        self.write_raw(await self.gpushare.rendered("pool", self.gpushare.service.pool))


class KernelsHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.write_raw(await self.gpushare.rendered("kernels", self.gpushare.server_kernels))

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def post(self) -> None:
        body = self.json_body()
        for name in ("name", "path"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise web.HTTPError(400, f"{name} must be a string, not {json.dumps(body[name])}")
        context = self.gpushare
        name = body.get("name") or context.default_kernelspec()
        path = body.get("path") or ""
        fields = _request_fields(body)
        try:
            spec = self.kernel_spec_manager.get_kernel_spec(name)
        except NoSuchKernel:
            raise web.HTTPError(
                400, f"no kernelspec named {name!r}; gpushare kernelspecs: {context.gpushare_kernelspecs()}"
            ) from None
        defaults = context.provisioner_config(spec)
        if defaults is None:
            raise web.HTTPError(
                400,
                f"kernelspec {name!r} does not use gpushare-provisioner; choose one of "
                f"{context.gpushare_kernelspecs()}",
            )
        merged = {**defaults, **fields}
        kernel_id = str(uuid.uuid4())
        # Checked before anything starts: a bad size, an impossible mode or a quota the user has
        # reached reserves nothing and starts nothing.
        context.service.make_request(
            merged.get("gpu_memory"), merged.get("gpu_mode"), merged.get("gpu_cores"), kernel_id
        )

        manager: Any = self.kernel_manager
        task = asyncio.ensure_future(
            manager.start_kernel(
                kernel_id=kernel_id, kernel_name=name, path=path or None, gpushare_path=path, **fields
            )
        )
        context.starts.track(Start(kernel_id, name, path, task), on_failure=context.forget_failed_start)
        started = await context.wait_for_start(kernel_id, task, START_ANSWER_WITHIN)
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        view = await asyncio.to_thread(context.kernel_view, kernel_id)
        self.write_json(view, status=201 if started else 202)


class KernelHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self, kernel_id: str) -> None:
        self.write_json(await asyncio.to_thread(self.gpushare.kernel_view, kernel_id))

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def patch(self, kernel_id: str) -> None:
        body = self.json_body()
        unknown = set(body) - {"gpu_memory"}
        if unknown:
            raise web.HTTPError(400, f"only gpu_memory can be changed, not {', '.join(sorted(unknown))}")
        if "gpu_memory" not in body:
            raise web.HTTPError(400, 'send {"gpu_memory": SIZE} to resize the slice')
        fields = _request_fields(body)
        if "gpu_memory" not in fields:
            raise web.HTTPError(400, 'gpu_memory must be a size such as "8G", not null')
        context = self.gpushare
        context.require_own(kernel_id)
        try:
            await asyncio.to_thread(context.service.resize, kernel_id, fields["gpu_memory"])
        except GPUShareError as error:
            if error.status == 409 or "does not fit" in str(error) or "cannot be resized" in str(error):
                raise web.HTTPError(409, str(error)) from None
            raise
        self.write_json(await asyncio.to_thread(context.kernel_view, kernel_id))


class KernelGPUHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def delete(self, kernel_id: str) -> None:
        context = self.gpushare
        context.require_own(kernel_id)
        record = context.service.ledger.get(kernel_id)
        if record is None:
            raise web.HTTPError(409, f"kernel {kernel_id} holds no GPU slice")
        if record.state == "queued":
            # A queued kernel has no process yet: withdrawing its request cancels its start.
            context.cancel_start(kernel_id)
        else:
            await asyncio.to_thread(context.service.release, kernel_id)
        self.set_status(204)
        self.finish()


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
                sequence, payload = getter.result()
                self.write(f"id: {sequence}\nevent: usage\ndata: {payload}\n\n")
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
    """What the JupyterLab size picker offers: the presets, the defaults, this node's modes."""

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        service = self.gpushare.service
        settings = service.settings
        self.write_json(
            {
                "sizes": list(settings.sizes),
                "default_memory": settings.default_memory,
                "default_mode": settings.default_mode,
                "modes": [
                    name for name, mode in MODES.items() if mode.unavailable_reason(service.facts) is None
                ],
            }
        )


class OpenAPIHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.finish(self.gpushare.openapi_text(), set_content_type="application/yaml")
