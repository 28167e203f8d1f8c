"""The accounting as the local backend uses it: besides folding and reports
(:class:`~jupyter_gpushare.backends.accounting.accounts.Accounts`, in the node ledger's file), the
queue's order in views, wait estimates and what the kernel rows say of idle kernels — handing the
ledger's rows to :mod:`~jupyter_gpushare.core.placement.queue_order` and
:mod:`~jupyter_gpushare.core.placement.wait_estimate`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jupyter_gpushare.backends.accounting import Activity, store
from jupyter_gpushare.backends.accounting.accounts import Accounts
from jupyter_gpushare.core.errors import LedgerError
from jupyter_gpushare.core.payloads import KernelPayload
from jupyter_gpushare.core.placement.allocator import Policy, Request
from jupyter_gpushare.core.placement.queue_order import QueueRule, Waiter, line_up
from jupyter_gpushare.core.placement.wait_estimate import estimates, expected_start
from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import parse_size

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.core.devices import Device


class LedgerAccounts(Accounts):
    """The accounting of one node ledger, and what the local queue takes from it: fair share's
    order, the wait estimates."""

    ledger: Ledger

    # ---- the queue and the kernel rows -------------------------------------------------------

    def recent(self, now: float, rule: QueueRule) -> dict[str, float]:
        """Each user's decayed reserved byte-seconds at ``now`` (fair share's order)."""
        return self.ledger.read_with(lambda db: store.recent(db, now, rule.half_life))

    def in_line(self, records: list[SliceRecord], policy: Policy) -> list[SliceRecord]:
        """``records`` with the queued ones in the order they are served (the positions shown)."""
        queued = [record for record in records if record.state == "queued"]
        if not policy.queue.fair or len(queued) < 2:
            return records
        now = time.time()
        usage = self.recent(now, policy.queue)
        by_id = {record.kernel_id: record for record in queued}
        order = line_up(
            (Waiter(r.kernel_id, r.owner, r.seq, r.requested_at) for r in queued), usage, now, policy.queue
        )
        return [record for record in records if record.state != "queued"] + [
            by_id[waiter.kernel_id] for waiter in order
        ]

    def describe(
        self,
        views: list[KernelPayload],
        records: Sequence[SliceRecord],
        devices: Sequence[Device],
        policy: Policy,
    ) -> None:
        """Add to the views of ``records`` (queue order as served) when each queued start is
        expected to be placed. A view it changes is replaced by a changed copy: the views a
        backend hands out may be kept and handed out again."""
        line = [record for record in records if record.state == "queued"]
        if not line:
            return
        history, kept = self.ledger.read_with(lambda db: (store.history(db), store.kept_estimates(db)))
        now = time.time()
        held = self.ledger.held()
        since = {record.kernel_id: record.placed_at for record in records if record.placed_at is not None}
        new: dict[str, tuple[float, float]] = {}
        for index, view in enumerate(views):
            kernel_id = view["kernel_id"]
            if kernel_id is None or view["state"] != "queued":
                continue
            position = next((i for i, record in enumerate(line) if record.kernel_id == kernel_id), None)
            if position is None:
                continue
            view = views[index] = copy.copy(view)
            me, ahead = _request(line[position]), [_request(record) for record in line[:position]]
            if kernel_id in kept:
                view["expected_start"] = expected_start(now, me, ahead, devices, held, since, history, policy)
                continue
            # Its first estimate: both are kept, to judge the model by when it is placed.
            both = estimates(now, me, ahead, devices, held, since, history, policy)
            view["expected_start"] = both.answer
            if both.model is not None and both.naive is not None:
                new[kernel_id] = (both.model, both.naive)
        if new:
            # A ledger that cannot be written (its views show the fault) still shows the estimates.
            with contextlib.suppress(LedgerError):
                self.ledger.write_with(lambda db: store.keep_estimates(db, new))


def _request(record: SliceRecord) -> Request:
    return Request(record.kernel_id, record.owner, parse_size(record.size), record.placement)


def show_idle(view: KernelPayload, activity: Activity | None) -> None:
    """Set ``idle_since``, ``idle_action`` and ``idle_action_at`` of a running kernel's view."""
    view["idle_since"] = view["idle_action"] = view["idle_action_at"] = None
    if activity is None or activity.busy:
        return
    view["idle_since"] = activity.at
    if activity.idle_after > 0:
        view["idle_action"] = "release" if activity.idle_action == "release" else "suspend"
        view["idle_action_at"] = activity.at + activity.idle_after


__all__ = ["LedgerAccounts", "show_idle"]
