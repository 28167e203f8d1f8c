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
from tornado.log import app_log

from ..errors import GPUShareError
from ..k8s.pool import Usage
from ..modes import MODES
from . import request_body
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
        return request_body.json_object(self.request.body or b"")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Never a traceback, never a 500 for our refusals: the reason, as a sentence.
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": error_message(kwargs.get("exc_info"), self._reason)}))


def error_message(exc_info: Any, reason: str) -> str:
    """The sentence for an error answer: ours as it is, tornado's without its "%%" escaping."""
    error = exc_info[1] if exc_info else None
    if isinstance(error, GPUShareError):
        return str(error)
    if isinstance(error, web.HTTPError) and error.log_message:
        return str(error.get_message() if hasattr(error, "get_message") else error.log_message)
    return reason


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
        self.write_raw(await self.gpushare.rendered("pool", self.gpushare.pool))


class KernelsHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.write_raw(await self.gpushare.rendered("kernels", self.gpushare.server_kernels))

    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def post(self) -> None:
        body = self.json_body()
        for name, limit in (("name", request_body.MAX_NAME_BYTES), ("path", request_body.MAX_PATH_BYTES)):
            if body.get(name) is not None:
                request_body.check_label(name, body[name], limit)
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
        context.check_request(
            merged.get("gpu_memory"), merged.get("gpu_mode"), merged.get("gpu_cores"), kernel_id
        )

        manager: Any = self.kernel_manager
        extra: dict[str, Any] = {}
        if context.cluster is not None:
            # The pod's phase and the scheduler's words, as they come, for GET kernels and the panel.
            extra["gpushare_on_state"] = lambda state: context.starts.note(kernel_id, state)
            context.started_as[kernel_id] = (name, path)
        task = asyncio.ensure_future(
            manager.start_kernel(
                kernel_id=kernel_id,
                kernel_name=name,
                path=path or None,
                gpushare_path=path,
                **fields,
                **extra,
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
        unknown = set(body) - {"gpu_memory", "restart"}
        if unknown:
            raise web.HTTPError(400, f"only gpu_memory can be changed, not {', '.join(sorted(unknown))}")
        if "gpu_memory" not in body:
            raise web.HTTPError(400, 'send {"gpu_memory": SIZE} to resize the slice')
        restart = body.get("restart", False)
        if not isinstance(restart, bool):
            raise web.HTTPError(400, f"restart must be true or false, not {json.dumps(restart)}")
        fields = _request_fields(body)
        if "gpu_memory" not in fields:
            raise web.HTTPError(400, 'gpu_memory must be a size such as "8G", not null')
        context = self.gpushare
        context.require_own(kernel_id)
        if context.cluster is not None:
            await context.resize_pod_kernel(kernel_id, fields["gpu_memory"], restart)
            self.write_json(await asyncio.to_thread(context.kernel_view, kernel_id))
            return
        # A refusal keeps the status of its type: 409 does not fit, 400 a bad size, 503 the ledger.
        await asyncio.to_thread(context.service.resize, kernel_id, fields["gpu_memory"])
        if restart:  # frameworks that read their cap only at start (JAX, TensorFlow) get the new one
            manager: Any = self.kernel_manager
            await manager.restart_kernel(kernel_id)
        self.write_json(await asyncio.to_thread(context.kernel_view, kernel_id))


class KernelGPUHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def delete(self, kernel_id: str) -> None:
        context = self.gpushare
        context.require_own(kernel_id)
        if context.cluster is not None:
            start = context.starts.get(kernel_id)
            if start is not None and not start.task.done():
                context.cancel_start(kernel_id)  # a pod not running yet: withdraw the start
                self.set_status(204)
                self.finish()
                return
            raise web.HTTPError(
                409,
                f"kernel {kernel_id} runs in a pod that holds its GPU until it ends: shut the kernel "
                "down, or restart it with another size",
            )
        record = context.service.ledger.get(kernel_id)
        if record is None:
            raise web.HTTPError(409, f"kernel {kernel_id} holds no GPU slice")
        if record.state == "queued":
            # A queued kernel has no process yet: withdrawing its request cancels its start.
            context.cancel_start(kernel_id)
        else:
            # The kernel runs on: it may take a slice again (%gpu request), and only it may.
            await asyncio.to_thread(context.service.release, kernel_id, True)
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
        context = self.gpushare
        service = context.service
        settings = service.settings
        if context.cluster is not None:
            offered = {mode for device in context.pool()["devices"] for mode in device["modes"]}
            modes = [name for name in MODES if name in offered]
        else:
            modes = [name for name, mode in MODES.items() if mode.unavailable_reason(service.facts) is None]
        self.write_json(
            {
                "sizes": list(settings.sizes),
                "default_memory": settings.default_memory,
                "default_mode": settings.default_mode,
                "modes": modes,
            }
        )


_restarts: set[asyncio.Future[Any]] = set()  # restarts asked for by kernel pods, until done


def _restart_done(task: asyncio.Future[Any]) -> None:
    _restarts.discard(task)
    if not task.cancelled() and task.exception() is not None:
        app_log.error("A kernel pod's restart with a new size failed: %s", task.exception())


class KernelTokenHandler(web.RequestHandler):
    """Routes a kernel pod calls about itself (``kernels/{id}/usage|self|resize``).

    The kernel is not a user of the server: it proves who it is with the token its Secret
    carries (header ``X-GPUShare-Token``), checked against its provisioner's, and may speak only
    of itself. No cookie is involved, so there is no XSRF check to make.
    """

    def check_xsrf_cookie(self) -> None:
        return None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": error_message(kwargs.get("exc_info"), self._reason)}))

    @property
    def gpushare(self) -> GPUShareContext:
        return self.settings["gpushare"]  # type: ignore[no-any-return]

    def kernel_pod(self, kernel_id: str) -> Any:
        """The provisioner of this server's kernel pod ``kernel_id``, once the token matches."""
        context = self.gpushare
        provisioner = context.provisioner_of(kernel_id) if context.cluster is not None else None
        if provisioner is None or not hasattr(provisioner, "token_matches"):
            raise web.HTTPError(404, f"no kernel pod {kernel_id} on this server")
        if not provisioner.token_matches(self.request.headers.get("X-GPUShare-Token")):
            raise web.HTTPError(403, f"the token does not belong to kernel {kernel_id}")
        return provisioner

    def json_body(self) -> Any:
        return request_body.json_value(self.request.body or b"")


class KernelUsageHandler(KernelTokenHandler):
    """``POST kernels/{id}/usage``: a kernel pod reports its own GPU use."""

    async def post(self, kernel_id: str) -> None:
        self.kernel_pod(kernel_id)
        usage = usage_from_report(self.json_body())
        cluster = self.gpushare.cluster
        assert cluster is not None
        cluster.report(kernel_id, usage)
        self.set_status(204)
        self.finish()


class KernelSelfHandler(KernelTokenHandler):
    """``GET kernels/{id}/self``: what ``%gpu status``/``pool`` show in a kernel pod."""

    async def get(self, kernel_id: str) -> None:
        self.kernel_pod(kernel_id)
        context = self.gpushare
        kernel = await asyncio.to_thread(context.kernel_view, kernel_id)
        pool = await asyncio.to_thread(context.pool)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"kernel": kernel, "pool": pool}))


class KernelResizeHandler(KernelTokenHandler):
    """``POST kernels/{id}/resize`` ``{"gpu_memory"}``: ``%gpu resize SIZE --restart`` in a pod.

    Answers before the restart begins: the restart ends the very kernel that is asking.
    """

    RESTART_AFTER = 0.5  # seconds: the kernel reads the answer before its pod is replaced

    async def post(self, kernel_id: str) -> None:
        provisioner = self.kernel_pod(kernel_id)
        body = self.json_body()
        if not isinstance(body, dict) or set(body) != {"gpu_memory"}:
            raise web.HTTPError(400, 'send {"gpu_memory": SIZE}')
        memory = _request_fields(body).get("gpu_memory")
        if memory is None:
            raise web.HTTPError(400, 'gpu_memory must be a size such as "8G", not null')
        context = self.gpushare
        context.check_request(memory, getattr(provisioner, "gpu_mode", None), None, kernel_id)
        try:
            provisioner.resize_to(memory)
        except GPUShareError as error:
            raise web.HTTPError(409 if error.status == 409 else 400, str(error)) from None
        manager: Any = context.kernel_manager

        def restart() -> None:
            task = asyncio.ensure_future(manager.restart_kernel(kernel_id))
            _restarts.add(task)
            task.add_done_callback(_restart_done)

        asyncio.get_running_loop().call_later(self.RESTART_AFTER, restart)
        self.set_status(202)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": f"restarting kernel {kernel_id} in a new pod with {memory}"}))


def usage_from_report(body: Any) -> Usage:
    """A kernel's report, checked: ``{"memory_used": bytes, "utilization": 0-100|null, "source"}``."""
    if not isinstance(body, dict):
        raise web.HTTPError(400, "the report must be a JSON object")
    used, utilization = body.get("memory_used"), body.get("utilization")
    source = body.get("source", "kernel")
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise web.HTTPError(400, f"memory_used must be a whole number of bytes, not {json.dumps(used)}")
    if utilization is not None and (
        isinstance(utilization, bool) or not isinstance(utilization, int) or not 0 <= utilization <= 100
    ):
        raise web.HTTPError(400, f"utilization must be 0-100 or null, not {json.dumps(utilization)}")
    if source not in ("kernel", "simulated"):
        raise web.HTTPError(400, f'source must be "kernel" or "simulated", not {json.dumps(source)}')
    return Usage(used, utilization, source)


class OpenAPIHandler(GPUShareHandler):
    @web.authenticated  # type: ignore[untyped-decorator]
    @authorized  # type: ignore[untyped-decorator]
    async def get(self) -> None:
        self.finish(self.gpushare.openapi_text(), set_content_type="application/yaml")
