"""What a backend kind adds to ``jupyter gpushare broker``: its side, found through the registry.

A kind names its side in its :class:`~jupyter_gpushare.backends.registry.BackendKind`
(``broker_side = "module:attribute"``): how the broker holds that kind's pool (its
:class:`~.authority.Authority`), the routes it serves beside everyone's, and what it settles in
the settings before anything reads them. The broker never asks which kind it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from tornado import web

from jupyter_gpushare.backends.registry import kind_for, load
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import ConfigurationError

if TYPE_CHECKING:
    from jupyter_gpushare.backends.broker_base.authority import Authority
    from jupyter_gpushare.config.broker import GPUShareBroker

Route = tuple[str, type[web.RequestHandler]]


class BrokerSide(Protocol):
    """One kind's part of the broker."""

    @property
    def routes(self) -> Sequence[Route]:
        """Its routes (patterns under the broker's prefix), beside the ones every kind serves."""

    def prepare(self, settings: GPUShare) -> None:
        """Settle what the broker's settings leave open for this kind (before anything reads them)."""

    def authority(self, settings: GPUShare, broker: GPUShareBroker) -> Authority:
        """Hold the pool: the backend as each caller may use it."""


def broker_side(settings: GPUShare) -> BrokerSide:
    """The broker's side of the kind ``settings`` choose; one sentence where it has none."""
    kind = kind_for(settings)
    if not kind.broker_side:
        raise ConfigurationError(f"the GPU broker cannot hold the {kind.name} backend")
    side: BrokerSide = load(kind.broker_side)
    return side


__all__ = ["BrokerSide", "Route", "broker_side"]
