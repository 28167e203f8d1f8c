"""Sharing modes. Each is one module answering every question about itself (:mod:`.base`), found
through the entry-point group ``jupyter_gpushare.modes`` (:mod:`.registry`): adding one is a new
module and an entry point, not new ``if``s."""

from __future__ import annotations

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts
from jupyter_gpushare.core.modes.facts import probe_node
from jupyter_gpushare.core.modes.registry import MODES, UnknownModeError, get_mode, mode_names

__all__ = ["MODES", "Grant", "Mode", "NodeFacts", "UnknownModeError", "get_mode", "mode_names", "probe_node"]
