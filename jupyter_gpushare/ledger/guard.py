"""The ledger's guard: a daemon thread (one per process) that checks the file every round, so
that a deleted ledger is put back within one round even while nobody places a kernel, and a
fault is logged once with its fix, and once more when it is mended."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import LedgerError

log = logging.getLogger("jupyter_gpushare")


class Guard:
    def __init__(
        self, path: Path, check: Callable[[], LedgerError | None], wanted: Callable[[], bool]
    ) -> None:
        self._path = path
        self._check = check  # mends what it can; the fault that is left, or None
        # False while this process holds no file and was asked for none: the guard never
        # creates a ledger by itself.
        self._wanted = wanted
        self._interval = 1.0
        self._pid: int | None = None
        self._reported: str | None = None

    def start(self, interval: float) -> None:
        """Check every ``interval`` seconds (a second call only changes the interval)."""
        self._interval = max(0.1, interval or 1.0)
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()  # a forked child starts its own
        threading.Thread(target=self._rounds, name="gpushare-ledger-guard", daemon=True).start()

    def _rounds(self) -> None:
        while True:
            time.sleep(self._interval)
            if self._wanted():
                self.round()

    def round(self) -> None:
        fault = self._check()
        if fault is not None and str(fault) != self._reported:
            log.error("jupyter_gpushare: %s", fault)
        elif fault is None and self._reported is not None:
            log.warning("jupyter_gpushare: the GPU ledger %s is usable again", self._path)
        self._reported = None if fault is None else str(fault)
