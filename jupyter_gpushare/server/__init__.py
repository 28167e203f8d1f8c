"""The jupyter_server extension (REST API, live stream, Prometheus metrics)."""

from jupyter_gpushare.server.extension import load_jupyter_server_extension

_load_jupyter_server_extension = load_jupyter_server_extension

__all__ = ["load_jupyter_server_extension"]
