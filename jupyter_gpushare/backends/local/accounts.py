"""The accounting as the local backend uses it: folding, reports, the queue's order in views,
wait estimates and what the kernel rows say of idle kernels.

The figures live in the node ledger's file (:mod:`jupyter_gpushare.backends.local.accounting`); this
module opens the transactions (:meth:`Ledger.write_with`, :meth:`Ledger.read_with`) and hands the
rows to the pure code: :mod:`~jupyter_gpushare.core.accounting.tally`,
:mod:`~jupyter_gpushare.core.accounting.usage_report`,
:mod:`~jupyter_gpushare.core.placement.queue_order` and
:mod:`~jupyter_gpushare.core.placement.wait_estimate`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jupyter_gpushare.backends.local.accounting import Activity, Keeping, store
from jupyter_gpushare.core.accounting.tally import Figures
from jupyter_gpushare.core.accounting.usage_report import check_by, report
from jupyter_gpushare.core.errors import LedgerError
from jupyter_gpushare.core.payloads import KernelPayload, UsagePayload
from jupyter_gpushare.core.placement.allocator import Policy, Request
from jupyter_gpushare.core.placement.queue_order import QueueRule, Waiter, line_up
from jupyter_gpushare.core.placement.wait_estimate import History, estimates, expected_start
from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import parse_size
from jupyter_gpushare.core.visibility import EVERYONE

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.core.devices import Device

IDLE_ACTIONS = ("suspend", "release")


class Accounts:
    """The accounting of one node ledger, with the settings of the process that reads it."""

    def __init__(self, ledger: Ledger, settings: Callable[[], GPUShare]) -> None:
        self.ledger = ledger
        self._settings = settings
        self._groups: dict[str, tuple[str, ...]] = {}

    def keeping(self) -> Keeping:
        settings = self._settings()
        return Keeping(
            settings.accounting_retention, settings.accounting_history, settings.fair_share_half_life
        )

    # ---- writes ----------------------------------------------------------------------------------

    def fold(self) -> int:
        """Fold the events recorded since the last fold (nothing is written when there are none,
        so readers' caches of the ledger stay valid)."""
        if not self.ledger.read_with(store.pending):
            return 0
        keeping = self.keeping()
        return self.ledger.write_with(lambda db: store.fold_events(db, time.time(), keeping))

    def note_activity(
        self, kernel_id: str, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> bool:
        """A kernel's cell started (``busy``) or ended at ``at``, and what its idle timer does."""
        action = idle_action if idle_action in IDLE_ACTIONS else "suspend"
        return self.ledger.write_with(
            lambda db: store.note_activity(db, kernel_id, busy, at, max(0.0, idle_after), action)
        )

    def note_groups(self, owner: str, groups: Sequence[str]) -> None:
        """``owner``'s JupyterHub groups (written only when they change)."""
        known = tuple(sorted(set(groups)))
        if self._groups.get(owner) == known:
            return
        self.ledger.write_with(lambda db: store.note_groups(db, owner, known, time.time()))
        self._groups[owner] = known

    # ---- reports ---------------------------------------------------------------------------------

    def report(self, since: float, by: str, viewer: str) -> UsagePayload:
        """``viewer``'s figures (everyone's for an admin) over the last ``since`` seconds."""
        check_by(by)
        self.fold()
        now = time.time()
        owners = None if viewer == EVERYONE else [viewer]

        def read(db: object) -> UsagePayload:
            buckets, kernels = store.buckets(db, now - since, now, owners)  # type: ignore[arg-type]
            return report(
                buckets,
                since=now - since,
                until=now,
                by=by,
                scope="everyone" if owners is None else "self",
                kernels=kernels,
                groups=store.groups(db),  # type: ignore[arg-type]
            )

        return self.ledger.read_with(read)  # type: ignore[arg-type]

    def totals(self, viewer: str) -> dict[str, Figures]:
        """Every user's figures since accounting began (``viewer``'s own unless an admin)."""
        self.fold()
        owners = None if viewer == EVERYONE else [viewer]
        now = time.time()
        return self.ledger.read_with(lambda db: store.totals(db, now, owners))

    # ---- the queue and the kernel rows -------------------------------------------------------

    def recent(self, now: float, rule: QueueRule) -> dict[str, float]:
        """Each user's decayed reserved byte-seconds at ``now`` (fair share's order)."""
        return self.ledger.read_with(lambda db: store.recent(db, now, rule.half_life))

    def history(self) -> History:
        """The finished holds the wait estimates go by."""
        return self.ledger.read_with(store.history)

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

    def activity(self) -> dict[str, Activity]:
        """The kernels' own reports of their cells (a running kernel's view shows since when it
        is idle and what its idle timer will do: :func:`show_idle`)."""
        return self.ledger.read_with(store.activity)

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


__all__ = ["Accounts", "show_idle"]
