"""``%gpu watch``: a live ipywidgets view of this kernel's slice, and a text view of it for
front ends that show no widgets (a terminal)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

import ipywidgets as widgets

from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import format_bytes

HISTORY = 60  # samples in the sparkline: one minute at the default 1 s interval
# A front end that shows no widgets (``jupyter console``) shows the text view instead: it says why
# it does not move.
NO_WIDGETS = (
    "(a snapshot: the live view needs a front end that shows widgets, such as JupyterLab; "
    "%gpu status shows the slice again)"
)


def sparkline(values: list[int | None], width: int = 180, height: int = 28) -> str:
    """An inline SVG polyline of utilisation (0–100); unknown samples are skipped."""
    known = [(index, value) for index, value in enumerate(values) if value is not None]
    if not known:
        return f'<svg width="{width}" height="{height}"></svg>'
    step = width / max(1, HISTORY - 1)
    points = " ".join(f"{index * step:.1f},{height - value * height / 100:.1f}" for index, value in known)
    return (
        f'<svg width="{width}" height="{height}" style="background:#f5f5f5">'
        f'<polyline fill="none" stroke="#1976d2" stroke-width="1.5" points="{points}"/></svg>'
    )


class WatchedSlice(Protocol):
    """What the live view reads of this kernel's slice (a local kernel's ``NodeSliceHandle``)."""

    @property
    def sample_interval(self) -> float: ...

    def record(self) -> SliceRecord | None: ...

    def device_label(self, record: SliceRecord) -> str: ...


class SliceWatch(widgets.VBox):  # type: ignore[misc]
    """Slice, used memory (bar) and utilisation (sparkline), refreshed every ``interval`` s."""

    def __init__(self, own: WatchedSlice, interval: float | None = None, start: bool = True) -> None:
        self.own = own
        self.interval = interval or own.sample_interval
        self.title = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0.0, max=100.0, description="used")
        self.used = widgets.Label()
        self.spark = widgets.HTML()
        self.warnings = widgets.HTML()
        self.history: deque[int | None] = deque(maxlen=HISTORY)
        self.text: list[str] = []  # the same view in plain text, from the same refresh
        super().__init__([self.title, widgets.HBox([self.bar, self.used]), self.spark, self.warnings])
        self._stop = threading.Event()
        self.refresh()
        if start:
            threading.Thread(target=self._loop, name="gpushare-watch", daemon=True).start()

    def refresh(self) -> None:
        record = self.own.record()
        if record is None:
            self.title.value = "<b>No GPU slice</b> — take one with <code>%gpu request 4G</code>"
            self.bar.value = 0.0
            self.used.value = ""
            self.history.append(None)
            self.text = ["No GPU slice — take one with %gpu request 4G"]
        else:
            used = record.memory_used or 0
            share = 100 * used / record.memory if record.memory else 0.0
            where = f"({record.mode}) on {self.own.device_label(record)}"
            self.title.value = f"<b>GPU slice {format_bytes(record.memory)}</b> {where}"
            self.bar.value = min(100.0, share)
            self.bar.bar_style = "danger" if share > 100 else "warning" if share >= 90 else "success"
            self.used.value = (
                f"{format_bytes(used)} of {format_bytes(record.memory)} ({share:.0f}%)"
                if record.memory_used is not None
                else "not measured yet"
            )
            self.history.append(record.utilization)
            self.warnings.value = "".join(f"<div>&#9888; {warning}</div>" for warning in record.warnings)
            self.text = [
                f"GPU slice {format_bytes(record.memory)} {where}",
                f"Used: {self.used.value}"
                + (f", utilization {record.utilization}%" if record.utilization is not None else ""),
                *(f"Warning: {warning}" for warning in record.warnings),
            ]
        self.spark.value = sparkline(list(self.history))

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget, with the text view as its plain text: a front end that cannot show the
        widget shows the text (ipywidgets' own is the widget's repr)."""
        bundle: dict[str, Any] = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = "\n".join([*self.text, NO_WIDGETS])
        return bundle

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # the ledger may be briefly unavailable; try next tick
                continue

    def stop(self) -> None:
        self._stop.set()
