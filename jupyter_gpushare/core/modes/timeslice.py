"""Time-slicing: kernels share a card's memory; caps are soft (framework limits + watchdog)."""

from __future__ import annotations

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps


class TimesliceMode(Mode):
    name = "timeslice"
    soft_limit = True
    live_resize = True  # the reservation and PyTorch/CuPy caps can move; JAX/TF need a restart
    enforcement = "soft: framework caps and watchdog"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        return None

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        return framework_caps(grant)
