"""The ``c.GPUShare`` traits of the queue's order and of the accounting (docs/admins/accounting.md).

Kept apart from :mod:`jupyter_gpushare.config.traits` (which inherits them into ``GPUShare``) so that
each module stays small; they are set, read from ``JUPYTER_GPUSHARE_<TRAIT>`` and documented
exactly like every other ``GPUShare`` trait.
"""

from __future__ import annotations

from typing import Any

from traitlets import Enum, Float, HasTraits, validate

from jupyter_gpushare.core.placement.queue_order import QUEUE_POLICIES, QueueRule

DAY = 86400.0


class AccountingTraits(HasTraits):
    """The queue's order and the accounting's memory (mixed into ``GPUShare``)."""

    queue_policy = Enum(
        list(QUEUE_POLICIES),
        default_value="fifo",
        config=True,
        help="Who of the requests waiting for room goes first. 'fifo': the order they were made "
        "in. 'fair': the request of the user with the least recent GPU use (reserved GiB·hours, "
        "each counting half as much every fair_share_half_life) goes first, a user's own requests "
        "in the order they were made, and none is held back longer than queue_age_bound. Either "
        "way the first in line waits until it fits (nobody skips past it).",
    ).tag(administered=True)
    fair_share_half_life = Float(
        DAY,
        config=True,
        help="Seconds after which a GiB·hour a user reserved counts half as much for "
        "queue_policy = 'fair' (default: a day).",
    )
    queue_age_bound = Float(
        120.0,
        config=True,
        help="Seconds after which fair share holds a waiting request back no longer: from then on "
        "it is served in arrival order, ahead of every younger request (no start starves). Keep "
        "it below queue_timeout.",
    )
    accounting_retention = Float(
        7 * DAY,
        config=True,
        help="Seconds the accounting keeps each kernel's figures in 15-minute steps (jupyter "
        "gpushare report --by kernel, the Usage chart); older figures are kept per user and hour.",
    )
    accounting_history = Float(
        400 * DAY,
        config=True,
        help="Seconds the accounting keeps figures per user and hour (0 = forever). The "
        "Prometheus counters count from the first day whatever this is.",
    )

    @validate("fair_share_half_life", "queue_age_bound", "accounting_retention")
    def _check_positive(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not value > 0:
            raise ValueError(f"GPUShare.{proposal['trait'].name} must be a number of seconds above 0")
        return value

    @validate("accounting_history")
    def _check_history(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if value < 0:
            raise ValueError("GPUShare.accounting_history must not be negative (0 keeps everything)")
        return value

    def queue_rule(self) -> QueueRule:
        """The queue's order as the allocator's policy carries it."""
        return QueueRule(self.queue_policy, self.fair_share_half_life, self.queue_age_bound)


__all__ = ["AccountingTraits"]
