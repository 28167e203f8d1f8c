"""The jupyter_server extension: routes, stream and metrics wired to the one service."""

from __future__ import annotations

import socket
from typing import Any

from jupyter_server.utils import url_path_join

from ..config import GPUShare, load_settings
from ..errors import LedgerError
from ..provisioners.kubernetes import server_identity, set_new_pod_listener, set_report_base
from ..service import service_for
from . import handlers, log_filter, metrics
from .cluster_pool import ClusterPool
from .context import GPUShareContext
from .websockets import close_kernel_websockets

LOOPBACK = ("localhost", "127.0.0.1", "::1")
EVERY_INTERFACE = ("", "0.0.0.0", "*", "::")


def report_base(settings: GPUShare, serverapp: Any) -> str | None:
    """The URL kernel pods reach this server at: ``server_url``, else this host's address."""
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
    log_filter.install(serverapp.log)
    settings = load_settings(serverapp.config)
    service = service_for(settings)
    cluster = None
    if settings.backend == "kubernetes":
        server_id, owner = server_identity(settings)
        cluster = ClusterPool(settings, server_id, owner)
        set_report_base(lambda: report_base(settings, serverapp))
        set_new_pod_listener(close_kernel_websockets)
        if not settings.server_url and str(serverapp.ip) in LOOPBACK:
            serverapp.log.warning(
                "jupyter_gpushare: this server listens on %s only; kernel pods in a cluster cannot "
                "reach it to report their GPU use (set c.GPUShare.server_url or ServerApp.ip)",
                serverapp.ip,
            )
    context = GPUShareContext(
        service=service,
        kernel_manager=serverapp.kernel_manager,
        kernel_spec_manager=serverapp.kernel_spec_manager,
        cluster=cluster,
    )
    web_app = serverapp.web_app
    web_app.settings["gpushare"] = context
    base = url_path_join(web_app.settings["base_url"], "api", "gpushare")
    kernel = r"(?P<kernel_id>[^/]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "pool"), handlers.PoolHandler),
            (url_path_join(base, "kernels"), handlers.KernelsHandler),
            (url_path_join(base, "kernels", kernel), handlers.KernelHandler),
            (url_path_join(base, "kernels", kernel, "gpu"), handlers.KernelGPUHandler),
            (url_path_join(base, "kernels", kernel, "usage"), handlers.KernelUsageHandler),
            (url_path_join(base, "kernels", kernel, "self"), handlers.KernelSelfHandler),
            (url_path_join(base, "kernels", kernel, "resize"), handlers.KernelResizeHandler),
            (url_path_join(base, "stream"), handlers.StreamHandler),
            (url_path_join(base, "config"), handlers.ConfigHandler),
            (url_path_join(base, "openapi.yaml"), handlers.OpenAPIHandler),
        ],
    )
    metrics.register(context.metrics_snapshot)
    if cluster is not None:
        serverapp.log.info(
            "jupyter_gpushare: Kubernetes backend, kernel pods in namespace %s",
            getattr(cluster, "namespace", "?"),
        )
        return
    try:
        devices = service.devices()
    except LedgerError as error:  # the routes answer it; the guard mends what it can
        serverapp.log.error("jupyter_gpushare: %s", error)
        return
    serverapp.log.info(
        "jupyter_gpushare: %d GPU(s)%s, ledger %s",
        len(devices),
        " (simulated)" if service.inventory.simulated else "",
        service.ledger.path,
    )
    if not devices:
        serverapp.log.warning("jupyter_gpushare: %s", service.inventory.problem)
