"""The jupyter_server extension: routes, stream and metrics wired to the one service."""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join

from ..config import load_settings
from ..service import service_for
from . import handlers, metrics
from .context import GPUShareContext


def load_jupyter_server_extension(serverapp: Any) -> None:
    settings = load_settings(serverapp.config)
    service = service_for(settings)
    context = GPUShareContext(
        service=service,
        kernel_manager=serverapp.kernel_manager,
        kernel_spec_manager=serverapp.kernel_spec_manager,
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
            (url_path_join(base, "stream"), handlers.StreamHandler),
            (url_path_join(base, "config"), handlers.ConfigHandler),
            (url_path_join(base, "openapi.yaml"), handlers.OpenAPIHandler),
        ],
    )
    metrics.register(context.metrics_snapshot)
    serverapp.log.info(
        "jupyter_gpushare: %d GPU(s)%s, ledger %s",
        len(service.devices()),
        " (simulated)" if service.inventory.simulated else "",
        service.ledger.path,
    )
    if not service.devices():
        serverapp.log.warning("jupyter_gpushare: %s", service.inventory.problem)
