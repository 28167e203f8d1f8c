"""Sharing modes. Adding one (Volcano, DRA…) is a new object in ``MODES``, not new ``if``s."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts
from jupyter_gpushare.core.modes.exclusive import ExclusiveMode
from jupyter_gpushare.core.modes.facts import probe_node
from jupyter_gpushare.core.modes.mig import MIGMode
from jupyter_gpushare.core.modes.mps import MPSMode
from jupyter_gpushare.core.modes.timeslice import TimesliceMode
from jupyter_gpushare.core.modes.vgpu import VGPUMode

MODES: Mapping[str, Mode] = MappingProxyType(
    {mode.name: mode for mode in (ExclusiveMode(), TimesliceMode(), MPSMode(), VGPUMode(), MIGMode())}
)


class UnknownModeError(ValueError):
    """A mode name that is not one of ``MODES``."""


def get_mode(name: str) -> Mode:
    """The mode called ``name``, or an error listing the known ones."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise UnknownModeError(f"unknown GPU mode {name!r}; choose one of: {', '.join(MODES)}") from None


__all__ = ["MODES", "Grant", "Mode", "NodeFacts", "UnknownModeError", "get_mode", "probe_node"]
