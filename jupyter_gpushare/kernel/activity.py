"""Cell hooks: new warnings, the idle timer, and the resume of a suspended kernel before a cell.

Idleness is known best inside the kernel (a long-running cell is not idle), so the idle clock
runs here: after ``idle_release_after`` seconds without running code the kernel's slice does its
``idle_action`` (suspend, or release), and says so the next time it runs code. Before each cell
the kernel's slice may act (a suspended kernel resumes, waiting for a slice like a start); if
that fails, the cell is held back with the reason instead of running into CUDA calls that would
wait for ever.
"""

from __future__ import annotations

import ast
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from IPython.core.error import InputRejected


class CellHooks(Protocol):
    """What the hooks ask of this kernel's slice (``NodeSliceHandle``; a pod's ``PodSliceHandle``)."""

    def on_idle(self, idle_for: float) -> str | None:
        """Do the idle action; the notice for the next cell, or None when nothing was done."""

    def before_cell(self, source: str) -> None:
        """Called before a cell runs (a suspended kernel resumes); raises ``GPUShareError``
        with the reason the cell must not run."""

    def warnings(self) -> tuple[str, ...]:
        """The warnings on this kernel's slice now (shown after a cell when new)."""


log = logging.getLogger("jupyter_gpushare")


class CellHeldBack(InputRejected):  # type: ignore[misc]
    """The cell did not run: the reason, without a traceback (IPython shows ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"GPU: this cell did not run: {self}"]


class _Gate(ast.NodeTransformer):
    """An AST transformer: the only hook between ``pre_run_cell`` and the cell's code that can
    stop the code from running."""

    def __init__(self, watch: ActivityWatch) -> None:
        self._watch = watch

    def visit(self, node: ast.AST) -> ast.AST:
        reason = self._watch.take_refusal()
        if reason is not None:
            raise CellHeldBack(reason)
        return node


class ActivityWatch:
    """``hooks`` reaches its slice only when a cell first needs it, so loading the extension costs
    a kernel's start nothing but these hooks."""

    def __init__(self, hooks: CellHooks, idle_release_after: float) -> None:
        self._hooks = hooks
        self.idle_release_after = idle_release_after
        self.last_activity = time.monotonic()
        self.running_cell = False
        self.notice: str | None = None
        self._refusal: str | None = None
        self._after_cell: list[Callable[[], None]] = []
        self._idle_done = False  # the idle action ran (or failed): not again until new activity
        self._shown_warnings: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Cells started and ended, told to the accounting off the cell's thread (a cell never
        # waits for the ledger or the broker); the kernel is idle from its start.
        self._cells: queue.SimpleQueue[tuple[bool, float]] = queue.SimpleQueue()
        if getattr(hooks, "note_cell", None) is not None:
            self._cells.put((False, time.time()))
            threading.Thread(target=self._tell_cells, name="gpushare-cells", daemon=True).start()
        if idle_release_after > 0:
            thread = threading.Thread(target=self._idle_loop, name="gpushare-idle", daemon=True)
            thread.start()

    def register(self, shell: Any) -> None:
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        shell.ast_transformers.append(_Gate(self))

    def pre_run_cell(self, info: Any = None, *_: Any) -> None:
        self._cells.put((True, time.time()))
        with self._lock:
            self.running_cell = True
            notice, self.notice = self.notice, None
        if notice:
            print(notice, file=sys.stderr)
        from jupyter_gpushare.core.errors import GPUShareError

        try:
            self._hooks.before_cell(str(getattr(info, "raw_cell", "") or ""))
        except GPUShareError as error:
            self._refusal = str(error)
        except Exception as error:  # never let a hook break the kernel; the cell says why
            self._refusal = f"{type(error).__name__}: {error}"

    def take_refusal(self) -> str | None:
        """The reason the cell about to run must not, once (read by the AST gate)."""
        refusal, self._refusal = self._refusal, None
        return refusal

    def after_cell(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the running cell has ended (``%gpu suspend`` inside a cell)."""
        self._after_cell.append(action)

    def post_run_cell(self, *_: Any) -> None:
        self._cells.put((False, time.time()))
        with self._lock:
            self.running_cell = False
            self.last_activity = time.monotonic()
            self._idle_done = False
            actions, self._after_cell = self._after_cell, []
        for action in actions:
            try:
                action()
            except Exception as error:  # never let a hook break the user's cell
                print(f"GPU: {error}", file=sys.stderr)
        try:
            warnings = self._hooks.warnings()
        except Exception:  # never let a hook break the user's cell
            return
        new = [warning for warning in warnings if warning not in self._shown_warnings]
        self._shown_warnings = warnings
        for warning in new:
            print(f"GPU warning: {warning}", file=sys.stderr)

    def check_idle(self) -> bool:
        """Do the idle action if the kernel has been idle long enough; True if it did."""
        with self._lock:
            idle_for = time.monotonic() - self.last_activity
            if self.running_cell or self._idle_done or idle_for < self.idle_release_after:
                return False
            self._idle_done = True
        try:
            notice = self._hooks.on_idle(idle_for)
        except Exception as error:
            notice = f"GPU: the idle action failed: {error}"
        if notice is None:
            return False
        with self._lock:
            self.notice = notice
        return True

    def _tell_cells(self) -> None:
        note = self._hooks.note_cell  # type: ignore[attr-defined]
        while True:
            busy, at = self._cells.get()
            try:
                note(busy, at, self.idle_release_after)
            except Exception:  # the accounting must never break the kernel
                log.debug("GPU: the cell could not be accounted", exc_info=True)

    def _idle_loop(self) -> None:
        interval = max(0.05, min(5.0, self.idle_release_after / 4))
        while not self._stop.wait(interval):
            self.check_idle()

    def stop(self) -> None:
        self._stop.set()
