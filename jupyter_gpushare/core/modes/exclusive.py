"""Whole cards: the kernel is alone on its GPU, as the native device plugin would give it."""

from __future__ import annotations

from jupyter_gpushare.core.modes.base import Mode, NodeFacts


class ExclusiveMode(Mode):
    name = "exclusive"
    placement = "exclusive"
    enforcement = "whole card"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        return None
