"""The ledger's guard: a daemon thread (one per process) that checks the file every round, so
that a deleted ledger is put back within one round even while nobody places a kernel, and a
fault is logged once with its fix, and once more when it is mended.

Whoever else meets a fault in the background (a kernel's cleanup as a server stops, a broker's
housekeeping) reports it here too (:meth:`Guard.report_fault`), so that it is logged once between
them, not once per kernel or per round."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_gpushare.core.errors import BackendUnavailableError, LedgerError

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
        # The kind of fault last logged: a file truncated while it is read is "damaged" in one
        # sentence, then in another, and is one fault to the person reading the log.
        self._reported: type[BaseException] | None = None
        self._reporting = threading.Lock()

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
        if fault is not None:
            self.report_fault(fault)
            return
        with self._reporting:
            mended, self._reported = self._reported is not None, None
        if mended:
            log.warning("jupyter_gpushare: the GPU ledger %s is usable again", self._path)

    def report_fault(self, fault: BackendUnavailableError) -> None:
        """Log ``fault`` unless a fault of its kind was logged last (and not mended since)."""
        with self._reporting:
            if type(fault) is self._reported:
                return
            self._reported = type(fault)
        log.error("jupyter_gpushare: %s", fault)
