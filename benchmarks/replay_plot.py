"""The chart of ``replay.py``: GPUs needed and GPU-hours reserved, per way, against the bound
(matplotlib, from the ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot(
    rows: Sequence[tuple[Any, Any, Any]],
    card_memory: int,
    title: str,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [way.name for way, _, _ in rows]  # the last is the bound
    cards = [result.cards for _, result, _ in rows]
    hours = [result.reserved / card_memory / 3600 for _, result, _ in rows]
    colours = ["#9e9e9e"] + ["#1f77b4" if "no suspend" in n else "#2ca02c" for n in names[1:-1]] + ["#ff7f0e"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    positions = range(len(names))
    for axis, values, label, unit in (
        (left, cards, "GPUs needed for p95 wait <= 60 s", "{:.0f}"),
        (right, hours, "GPU-hours reserved (memory-weighted)", "{:,.0f}"),
    ):
        axis.barh(list(positions), values, color=colours)
        axis.set_xscale("log")
        axis.set_title(label, fontsize=10)
        for y, value in zip(positions, values, strict=True):
            axis.text(value * 1.08, y, unit.format(value), va="center", fontsize=8)
        axis.set_xlim(min(values) / 1.5, max(values) * 2.2)
        axis.grid(axis="x", which="both", alpha=0.25)
    left.set_yticks(list(positions), names, fontsize=8)
    left.invert_yaxis()
    figure.suptitle(f"Replay: {title}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
