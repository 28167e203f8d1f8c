"""Cell hooks: tell the user about new warnings, and release an idle kernel's slice.

Idleness is known best inside the kernel (a long-running cell is not idle), so the idle clock
runs here: after ``idle_release_after`` seconds without running code the kernel gives its slice
back, and says why the next time it runs code.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ..sizes import format_bytes
from .own_slice import OwnSlice


class ActivityWatch:
    def __init__(self, own: OwnSlice, idle_release_after: float) -> None:
        self.own = own
        self.idle_release_after = idle_release_after
        self.last_activity = time.monotonic()
        self.running_cell = False
        self.notice: str | None = None
        self._shown_warnings: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if idle_release_after > 0:
            thread = threading.Thread(target=self._idle_loop, name="gpushare-idle", daemon=True)
            thread.start()

    def register(self, shell: Any) -> None:
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)

    def pre_run_cell(self, *_: Any) -> None:
        with self._lock:
            self.running_cell = True
            notice, self.notice = self.notice, None
        if notice:
            print(notice, file=sys.stderr)

    def post_run_cell(self, *_: Any) -> None:
        with self._lock:
            self.running_cell = False
            self.last_activity = time.monotonic()
        try:
            record = self.own.record()
        except Exception:  # never let a hook break the user's cell
            return
        warnings = record.warnings if record else ()
        new = [warning for warning in warnings if warning not in self._shown_warnings]
        self._shown_warnings = warnings
        for warning in new:
            print(f"GPU warning: {warning}", file=sys.stderr)

    def check_idle(self) -> bool:
        """Release the slice if the kernel has been idle long enough; True if it did."""
        with self._lock:
            idle_for = time.monotonic() - self.last_activity
            if self.running_cell or idle_for < self.idle_release_after:
                return False
        try:
            if self.own.record() is None:
                return False
            released = self.own.release()
        except Exception:
            return False
        with self._lock:
            self.notice = (
                f"Your {format_bytes(released.memory)} GPU slice was released after {idle_for:.0f} s "
                "idle (GPUShare.idle_release_after). Take one again with %gpu request "
                f"{released.size}."
            )
        return True

    def _idle_loop(self) -> None:
        interval = max(0.05, min(5.0, self.idle_release_after / 4))
        while not self._stop.wait(interval):
            self.check_idle()

    def stop(self) -> None:
        self._stop.set()
