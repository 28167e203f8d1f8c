"""The broker's authority over the node ledger: the local backend as each of this node's users
may use it, and which kernel a calling process belongs to (by its lineage)."""

from __future__ import annotations

import logging

from jupyter_gpushare.backends.broker_base.authority import kernel_in_lineage
from jupyter_gpushare.backends.broker_base.identity import Caller
from jupyter_gpushare.backends.broker_base.waiting import WaitingLeases
from jupyter_gpushare.backends.local.backend import LocalBackend
from jupyter_gpushare.backends.processes import lineage
from jupyter_gpushare.core.errors import LedgerError

log = logging.getLogger("jupyter_gpushare.broker")


class LocalAuthority:
    """The node ledger, for the processes of this node's users."""

    def __init__(self, backend: LocalBackend, waiting_lease: float = 20.0) -> None:
        self.backend = backend
        self.local = backend
        self.waiting = WaitingLeases(waiting_lease)
        backend.samples_every_slice = True  # the broker's monitor samples every kernel

    def as_seen_by(self, caller: Caller) -> LocalBackend:
        if caller.groups:
            self.local.accounts.note_groups(caller.user, caller.groups)
        holder = caller.process if caller.process is not None else self.local.holder
        return self.local.scoped(caller.user, caller.server_id, holder, caller.viewer)

    def owner_of(self, kernel_id: str) -> str | None:
        ledger = self.local.ledger
        record = ledger.get(kernel_id)
        if record is not None:
            return record.owner
        left = ledger.released(kernel_id)  # a kernel running without a slice keeps its id
        return left.owner if left is not None else None

    def kernel_of(self, caller: Caller) -> str | None:
        if caller.process is None:
            return None
        ledger = self.local.ledger
        kernels = [(r.kernel_id, r.kernel) for r in ledger.records() if r.kernel is not None]
        kernels += [(left.kernel_id, left.process) for left in ledger.released_all() if left.attached]
        return kernel_in_lineage(lineage(caller.process), kernels)

    def housekeeping(self) -> None:
        try:
            self.local.reconcile()
            self.local.accounts.fold()
            self.drop_abandoned()
        except LedgerError as fault:  # the guard's to log, once: not a line every round
            self.local.report_fault(fault)

    def drop_abandoned(self) -> None:
        """Drop the waiting requests nobody asked after for the lease (see
        :mod:`jupyter_gpushare.backends.broker_base.waiting`)."""
        ledger = self.local.ledger
        queued = [record.kernel_id for record in ledger.records() if record.state == "queued"]
        abandoned = self.waiting.abandoned(queued)
        for record in ledger.withdraw_waiting(abandoned) if abandoned else []:
            log.warning(
                "dropped the waiting GPU request of kernel %s (%s's): nobody asked after it for %g s",
                record.kernel_id,
                record.owner,
                self.waiting.lease,
            )


__all__ = ["LocalAuthority"]
