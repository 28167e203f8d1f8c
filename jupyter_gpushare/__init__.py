"""jupyter-gpushare: fractional GPUs for Jupyter kernels.

This module holds extension points only; the pieces live in their own modules (see the layout
in docs/development.md).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext jupyter_gpushare``: the ``%gpu`` magics and framework caps in any kernel."""
    from jupyter_gpushare.kernel import load_ipython_extension as load

    load(shell)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """jupyter_server finds the REST API, stream and metrics here."""
    return [{"module": "jupyter_gpushare.server"}]


__all__ = ["__version__", "load_ipython_extension"]
