"""Routes a kernel calls about itself: ``kernels/{id}/usage``, ``…/activity``, ``…/self``,
``…/resize``, ``…/idle``.

A kernel is not a user of the server: it proves who it is with its own-slice token (header
``X-GPUShare-Token``; a kernel pod's comes from its Secret), checked by the kernel's provisioner,
and may speak only of itself. No cookie is involved, so there is no XSRF check to make. Kernels
in pods use these to report their GPU use and to act on their slice; any gpushare kernel may.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tornado import web
from tornado.log import app_log

from jupyter_gpushare.backends.broker_client.transport import TOKEN_HEADER
from jupyter_gpushare.core import request_body
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, NotOfferedError
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.http_errors import answering_domain_errors, message_of
from jupyter_gpushare.server.context import GPUShareContext
from jupyter_gpushare.server.routes import request_fields

RESTART_AFTER = 0.5  # seconds: the kernel reads the answer before it is restarted


class KernelTokenHandler(web.RequestHandler):
    def check_xsrf_cookie(self) -> None:
        return None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message_of(exc_info[1] if exc_info else None, status_code)}))

    @property
    def gpushare(self) -> GPUShareContext:
        return self.settings["gpushare"]  # type: ignore[no-any-return]

    def authenticate(self, kernel_id: str) -> Any:
        """The provisioner of kernel ``kernel_id``, once the caller's token proves it is that kernel."""
        return self.gpushare.kernel_by_token(kernel_id, self.request.headers.get(TOKEN_HEADER))

    def json_body(self) -> Any:
        return request_body.json_value(self.request.body or b"")

    def answer(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))


class KernelUsageHandler(KernelTokenHandler):
    """``POST kernels/{id}/usage``: a kernel reports its own GPU use."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        self.authenticate(kernel_id)
        report = usage_from_report(self.json_body())
        await asyncio.to_thread(self.gpushare.report_usage, kernel_id, report)
        self.set_status(204)
        self.finish()


class KernelActivityHandler(KernelTokenHandler):
    """``POST kernels/{id}/activity`` ``{"busy", "at", "idle_after", "idle_action"}``: a kernel
    (in a pod) says a cell started or ended; kept where the accounting is (on Kubernetes, the
    broker's: busy and idle hours), nothing kept where none is."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        self.authenticate(kernel_id)
        busy, at, idle_after, action = request_body.activity_report(self.json_body(), time.time())
        token = self.request.headers.get(TOKEN_HEADER)
        await asyncio.to_thread(
            self.gpushare.backend.note_activity, kernel_id, token, busy, at, idle_after, action
        )
        self.set_status(204)
        self.finish()


class KernelSelfHandler(KernelTokenHandler):
    """``GET kernels/{id}/self``: what ``%gpu status``/``pool`` show in a kernel pod."""

    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        self.authenticate(kernel_id)
        context = self.gpushare
        kernel = await asyncio.to_thread(context.kernel_view, kernel_id)
        pool = await asyncio.to_thread(context.pool)
        self.answer({"kernel": kernel, "pool": pool})


class KernelResizeHandler(KernelTokenHandler):
    """``POST kernels/{id}/resize`` ``{"gpu_memory"}``: ``%gpu resize SIZE --restart`` in a pod.

    Answers before the restart begins: the restart ends the very kernel that is asking.
    """

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        provisioner = self.authenticate(kernel_id)
        body = self.json_body()
        if not isinstance(body, dict) or set(body) != {"gpu_memory"}:
            raise web.HTTPError(400, 'send {"gpu_memory": SIZE}')
        memory = request_fields(body).get("gpu_memory")
        if memory is None:
            raise web.HTTPError(400, 'gpu_memory must be a size such as "8G", not null')
        if await provisioner.resize(memory, restart=True):
            self.gpushare.restart_later(kernel_id, RESTART_AFTER, _log_restart_failure)
        self.answer({"message": f"restarting kernel {kernel_id} with {memory}"}, status=202)


class KernelIdleHandler(KernelTokenHandler):
    """``POST kernels/{id}/idle`` ``{"idle_for": seconds}``: a kernel pod idle for
    ``idle_release_after`` asks to give its GPU memory back. A pod can only do that in a new
    pod, losing the kernel's variables, so the server restarts it only when the admin opted in
    (``GPUShare.idle_pod_restart``); otherwise 409 with the reason, and nothing changes."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        self.authenticate(kernel_id)
        body = self.json_body()
        idle_for = body.get("idle_for") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"idle_for"} or not _seconds(idle_for):
            raise web.HTTPError(400, 'send {"idle_for": SECONDS}')
        if not self.gpushare.backend.settings.idle_pod_restart:
            raise NotOfferedError(f"{POD_HOLDS_ITS_GPU} (GPUShare.idle_pod_restart is off)")
        app_log.info("Kernel %s idle for %.0f s: restarting it in a new pod", kernel_id, idle_for)
        self.gpushare.restart_later(kernel_id, RESTART_AFTER, _log_restart_failure)
        self.answer(
            {"message": f"idle for {idle_for:.0f} s: restarting in a new pod (the variables are lost)"},
            status=202,
        )


def _seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < 1e9


def _log_restart_failure(error: BaseException) -> None:
    app_log.error("A kernel's restart with a new size failed: %s", error)


def usage_from_report(body: Any) -> UsageReport:
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
    return UsageReport(used, utilization, source)
