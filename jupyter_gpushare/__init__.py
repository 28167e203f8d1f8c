"""jupyter-gpushare: fractional GPUs for Jupyter kernels.

This module holds extension points only; the pieces live in their own modules (see README).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
