"""Cell hooks: tell the user about new warnings, and release an idle kernel's slice.

Idleness is known best inside the kernel (a long-running cell is not idle), so the idle clock
runs here: after ``idle_release_after`` seconds without running code the kernel gives its slice
back, and says why the next time it runs code.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from .. import env_names

if TYPE_CHECKING:
    from ..records import SliceRecord


class IdleReleasable(Protocol):
    """What the idle timer needs of this kernel's slice (the ledger's ``OwnSlice``)."""

    def record(self) -> SliceRecord | None: ...

    def give_back(self) -> SliceRecord: ...


class ActivityWatch:
    """``own`` opens the ledger only when it is first needed, so loading the extension costs a
    kernel's start nothing but these hooks."""

    def __init__(self, own: IdleReleasable, idle_release_after: float) -> None:
        self._own = own
        self.idle_release_after = idle_release_after
        self.last_activity = time.monotonic()
        self.running_cell = False
        self.notice: str | None = None
        self._shown_warnings: tuple[str, ...] = ()
        self._ledger: Any = None
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
            warnings = self._warnings()
        except Exception:  # never let a hook break the user's cell
            return
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
            if self._own.record() is None:
                return False
            released = self._own.give_back()
        except Exception:
            return False
        from ..sizes import format_bytes

        with self._lock:
            self.notice = (
                f"Your {format_bytes(released.memory)} GPU slice was released after {idle_for:.0f} s "
                "idle (GPUShare.idle_release_after). Take one again with %gpu request "
                f"{released.size}."
            )
        return True

    def _warnings(self) -> tuple[str, ...]:
        """This kernel's warnings, read straight from the ledger (cheap after every cell); with a
        broker, asked of it (the kernel cannot open the ledger, and must not try)."""
        if os.environ.get(env_names.BROKER_URL):
            own = self._own.record() if os.environ.get(env_names.KERNEL_ID) else None
            return own.warnings if own else ()
        kernel_id = os.environ.get(env_names.KERNEL_ID)
        ledger_path = os.environ.get(env_names.LEDGER_PATH)
        if not kernel_id or not ledger_path or not os.path.exists(ledger_path):
            return ()
        if self._ledger is None:
            from ..ledger import Ledger

            self._ledger = Ledger(ledger_path)
        record = self._ledger.get(kernel_id)
        return record.warnings if record else ()

    def _idle_loop(self) -> None:
        interval = max(0.05, min(5.0, self.idle_release_after / 4))
        while not self._stop.wait(interval):
            self.check_idle()

    def stop(self) -> None:
        self._stop.set()
