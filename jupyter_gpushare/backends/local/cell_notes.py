"""What a local kernel tells and asks of the node ledger around every cell, without the backend.

Building the local backend probes the node's devices and registers them, which a kernel does only
once ``%gpu`` needs it. Before and after each cell it needs three things of its slice — what it
left counted when it released it, its cells' starts and ends for the accounting, its warnings —
and for these it opens the ledger file alone, once per kernel, and only once the file exists (a
kernel no provisioner pointed at a ledger opens nothing). The file is the kernel's user's own, so
the token a broker checks would guard nothing here: these calls do not read it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from jupyter_gpushare.backends.accounting import store
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.protocol import CellNotes
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.records import ReleasedSlice


class LedgerNotes(CellNotes):
    """One kernel's notes in the node ledger at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ledger: Ledger | None = None
        self._lock = threading.Lock()  # the cell's thread and the accounting's thread ask alike

    def _opened(self) -> Ledger | None:
        with self._lock:
            if self._ledger is None and self.path.exists():
                self._ledger = Ledger(self.path)
            return self._ledger

    def released(self, kernel_id: str) -> ReleasedSlice | None:
        ledger = self._opened()
        return ledger.released(kernel_id) if ledger is not None else None

    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        ledger = self._opened()
        if ledger is not None:
            ledger.write_with(
                lambda db: store.note_activity(db, kernel_id, busy, at, idle_after, idle_action)
            )

    def own_warnings(self, kernel_id: str, token: str | None) -> tuple[str, ...]:
        ledger = self._opened()
        record = ledger.get(kernel_id) if ledger is not None else None
        return record.warnings if record is not None else ()


def ledger_notes(settings: GPUShare) -> LedgerNotes | None:
    """The notes of a kernel whose provisioner named its ledger (``ledger_path``, given to it as
    ``$JUPYTER_GPUSHARE_LEDGER_PATH``); None for any other kernel: it has nothing to note."""
    if not settings.ledger_path:
        return None
    return LedgerNotes(Path(settings.ledger_path).expanduser())


__all__ = ["LedgerNotes", "ledger_notes"]
