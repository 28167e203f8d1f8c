"""The jupyter_server extension: routes, stream and metrics wired to the process's backend."""

from __future__ import annotations

import socket
from typing import Any

from jupyter_server.utils import url_path_join

from jupyter_gpushare.backends import ServerHooks, backend_for
from jupyter_gpushare.compat import shutdown_stops_restarts, watch_new_kernel_activity
from jupyter_gpushare.config import GPUShare, load_settings, unreported_warnings
from jupyter_gpushare.core import log_filter as refusals
from jupyter_gpushare.server import kernel_routes, metrics, routes, usage_routes
from jupyter_gpushare.server.context import GPUShareContext
from jupyter_gpushare.server.lifecycle import Reclaimer, settle_before_shutdown
from jupyter_gpushare.server.websockets import close_kernel_websockets

LOOPBACK = ("localhost", "127.0.0.1", "::1")
EVERY_INTERFACE = ("", "0.0.0.0", "*", "::")


def report_base(settings: GPUShare, serverapp: Any) -> str | None:
    """The URL kernels elsewhere (pods) reach this server at: ``server_url``, else this host's
    address, the server's port and base URL."""
    if settings.server_url:
        return settings.server_url.rstrip("/") + "/"
    ip = str(serverapp.ip or "")
    host = socket.gethostbyname(socket.gethostname()) if ip in EVERY_INTERFACE else ip
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if getattr(serverapp, "certfile", None) else "http"
    base_url = str(serverapp.base_url or "/")
    return f"{scheme}://{host}:{serverapp.port}{base_url if base_url.endswith('/') else base_url + '/'}"


def load_jupyter_server_extension(serverapp: Any) -> None:
    refusals.install(serverapp.log)
    settings = load_settings(serverapp.config)
    backend = backend_for(settings)

    def kernel_in_new_pod(kernel_id: str) -> int:
        # The browsers reconnect (to the new pod, through the server); so does the server's own
        # watch of the kernel's state.
        watch_new_kernel_activity(serverapp.kernel_manager, kernel_id)
        return close_kernel_websockets(kernel_id)

    backend.attach_server(
        ServerHooks(report_base=lambda: report_base(settings, serverapp), on_new_pod=kernel_in_new_pod)
    )
    shutdown_stops_restarts(serverapp.kernel_manager)  # a restart waiting for its pod must not 500
    context = GPUShareContext(
        backend=backend,
        kernel_manager=serverapp.kernel_manager,
        kernel_spec_manager=serverapp.kernel_spec_manager,
    )
    # Starts nobody waits for and kernels nobody uses are reclaimed; a stopping server settles
    # every start before it shuts its kernels down.
    reclaimer = Reclaimer(
        context,
        getattr(serverapp, "session_manager", None),
        lambda: settings.unused_kernel_timeout,
        serverapp.log,
    )
    settle_before_shutdown(serverapp.kernel_manager, reclaimer)
    if getattr(serverapp, "io_loop", None) is not None:  # started once the server's loop runs
        serverapp.io_loop.add_callback(reclaimer.start)
    web_app = serverapp.web_app
    web_app.settings["gpushare"] = context
    base = url_path_join(web_app.settings["base_url"], "api", "gpushare")
    kernel = r"(?P<kernel_id>[^/]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "pool"), routes.PoolHandler),
            (url_path_join(base, "kernels"), routes.KernelsHandler),
            (url_path_join(base, "kernels", kernel), routes.KernelHandler),
            (url_path_join(base, "kernels", kernel, "gpu"), routes.KernelGPUHandler),
            (url_path_join(base, "kernels", kernel, "suspend"), routes.KernelSuspendHandler),
            (url_path_join(base, "kernels", kernel, "resume"), routes.KernelResumeHandler),
            (url_path_join(base, "kernels", kernel, "idle"), kernel_routes.KernelIdleHandler),
            (url_path_join(base, "kernels", kernel, "usage"), kernel_routes.KernelUsageHandler),
            (url_path_join(base, "kernels", kernel, "activity"), kernel_routes.KernelActivityHandler),
            (url_path_join(base, "kernels", kernel, "self"), kernel_routes.KernelSelfHandler),
            (url_path_join(base, "kernels", kernel, "resize"), kernel_routes.KernelResizeHandler),
            (url_path_join(base, "stream"), routes.StreamHandler),
            (url_path_join(base, "config"), routes.ConfigHandler),
            (url_path_join(base, "fit"), routes.FitHandler),
            (url_path_join(base, "modes"), routes.ModesHandler),
            (url_path_join(base, "usage"), usage_routes.UsageHandler),
            (url_path_join(base, "openapi.yaml"), routes.OpenAPIHandler),
        ],
    )
    metrics.register(context.metrics_snapshot, backend.usage_totals)
    serverapp.log.info("jupyter_gpushare: %s backend, %s", backend.name, backend.location())
    if settings.settled is not None:
        serverapp.log.info("jupyter_gpushare: settings: %s", settings.settled.summary())
    for sentence in unreported_warnings(settings):
        serverapp.log.warning("jupyter_gpushare: %s", sentence)
    bypassed = settings.settled.broker_bypassed() if settings.settled else None
    if bypassed:
        serverapp.log.error("jupyter_gpushare: %s", bypassed)
    problem = backend.problem()
    if problem:
        serverapp.log.warning("jupyter_gpushare: %s", problem)
    if backend.remote_kernels and not settings.server_url and str(serverapp.ip) in LOOPBACK:
        serverapp.log.warning(
            "jupyter_gpushare: this server listens on %s only; kernels elsewhere (pods) cannot "
            "reach it to report their GPU use (set c.GPUShare.server_url or ServerApp.ip)",
            serverapp.ip,
        )
