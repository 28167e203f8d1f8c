"""The accounting as a backend keeps it in an sqlite file of its own: folding the events the
file's triggers recorded (:mod:`.schema`) into figures (:mod:`.store`), the reports, each user's
totals, and what kernels and users tell it (their cells, their groups).

The file is the node ledger's on the local backend, the Kubernetes broker's accounting file
there; either opens the transactions (``read_with``, ``write_with``) and this module hands the
rows to the pure code (:mod:`~jupyter_gpushare.core.accounting.tally`,
:mod:`~jupyter_gpushare.core.accounting.usage_report`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from jupyter_gpushare.backends.accounting import store
from jupyter_gpushare.backends.accounting.store import Activity, Keeping
from jupyter_gpushare.core.accounting.tally import Figures
from jupyter_gpushare.core.accounting.usage_report import check_by, report, row
from jupyter_gpushare.core.payloads import UsagePayload, UsageRowPayload
from jupyter_gpushare.core.placement.wait_estimate import History
from jupyter_gpushare.core.visibility import EVERYONE

if TYPE_CHECKING:
    from jupyter_gpushare.config import GPUShare

T = TypeVar("T")
IDLE_ACTIONS = ("suspend", "release")


class Transactions(Protocol):
    """A file the accounting lives in: one write transaction, one read snapshot."""

    def write_with(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    def read_with(self, work: Callable[[sqlite3.Connection], T]) -> T: ...


class Accounts:
    """The accounting kept in one file, with the settings of the process that reads it."""

    def __init__(self, ledger: Transactions, settings: Callable[[], GPUShare]) -> None:
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

    def total_rows(self, viewer: str) -> list[UsageRowPayload]:
        """``GET usage/totals``: :meth:`totals` as rows, a user's each."""
        return [row(owner, owner, figures, 0) for owner, figures in sorted(self.totals(viewer).items())]

    def history(self) -> History:
        """The finished holds the wait estimates go by."""
        return self.ledger.read_with(store.history)

    def activity(self) -> dict[str, Activity]:
        """The kernels' own reports of their cells (a running kernel's view shows since when it
        is idle and what its idle timer will do)."""
        return self.ledger.read_with(store.activity)


__all__ = ["IDLE_ACTIONS", "Accounts", "Transactions"]
