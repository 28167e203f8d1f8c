"""Suspend and resume a kernel's GPU state with the CUDA driver's checkpoint API.

:mod:`.driver` is the driver's edge (cuda.core or libcuda), :mod:`.simulated` a simulated pool's
stand-in, :mod:`.flows` the lock/checkpoint and restore/unlock sequences with their sentences,
and :mod:`.runner` how the backend runs them: in a helper process (``python -m
jupyter_gpushare.backends.local.checkpoint``), because the driver's calls act on another process.
"""

from __future__ import annotations

from jupyter_gpushare.backends.local.checkpoint.flows import Result
from jupyter_gpushare.backends.local.checkpoint.runner import HelperRunner, InProcessRunner, Runner

__all__ = ["HelperRunner", "InProcessRunner", "Result", "Runner"]
