"""The usage report: buckets of :mod:`jupyter_gpushare.tally` summed by user, group or kernel,
and the reserved-vs-used series the panel's chart draws. Pure.

The same payload answers ``GET api/gpushare/usage``, ``jupyter gpushare report`` and the
Prometheus counters, so the three cannot disagree. Figures are sums over whole buckets (15
minutes per kernel; an hour per user once older than ``GPUShare.accounting_retention``):
``since`` is rounded down to the bucket it falls in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import InvalidRequestError
from .payloads import UsagePayload, UsageRowPayload, UsageSeriesPayload
from .queue_order import HOUR, gib_hours
from .tally import DETAIL_SECONDS, ROLLED_SECONDS, Figures, bucket_of

By = Literal["user", "group", "kernel"]
Scope = Literal["self", "everyone"]
BY: tuple[By, ...] = ("user", "group", "kernel")
NO_GROUP = "(no group)"
OLDER_KERNELS = "(older kernels)"  # kernels of buckets rolled up by user and hour
SERIES_POINTS = 96  # about how many points a chart gets
_UNITS = {"s": 1, "m": 60, "min": 60, "h": HOUR, "d": 24 * HOUR, "w": 7 * 24 * HOUR}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$")
SINCE_FORMS = "a duration such as 7d, 24h, 90m or 2w (s, m, h, d, w)"


class ReportError(InvalidRequestError):
    """A report asked for in a way that cannot be answered (the sentence says why)."""


def parse_since(text: str) -> float:
    """Seconds back from now: ``7d``, ``24h``, ``90m``, ``2w``, ``3600s``."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ReportError(f"since must be {SINCE_FORMS}, not {text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 0 < seconds <= 3650 * 24 * HOUR:
        raise ReportError(f"since must be more than 0 and at most 3650 days, not {text!r}")
    return seconds


def check_by(by: str) -> By:
    if by not in BY:
        raise ReportError(f"by must be one of {', '.join(BY)}, not {by!r}")
    return by


def usage_query(arguments: Callable[[str], list[str]], default_since: str = "7d") -> tuple[float, By]:
    """``(since seconds, by)`` of a ``GET usage`` query (``since=7d&by=user`` by default), from
    ``arguments(name)`` (the values given for ``name``); a :class:`ReportError` otherwise."""
    values = {}
    for name, default in (("since", default_since), ("by", "user")):
        given = arguments(name)
        if len(given) > 1:
            raise ReportError(f"{name} may be given once, not {len(given)} times")
        values[name] = given[0] if given else default
    return parse_since(values["since"]), check_by(values["by"])


@dataclass(frozen=True)
class Bucket:
    """One stored or computed bucket of one kernel (``kernel_id`` "" once rolled up by user)."""

    start: float
    width: float
    kernel_id: str
    owner: str
    figures: Figures


def row(key: str, label: str, figures: Figures, kernels: int) -> UsageRowPayload:
    starts = figures.starts
    return {
        "key": key,
        "label": label,
        "kernels": kernels,
        "reserved_gib_hours": gib_hours(figures.reserved),
        "used_gib_hours": gib_hours(figures.used),
        "used_share": figures.used / figures.reserved if figures.reserved > 0 else None,
        "busy_hours": figures.busy / HOUR,
        "idle_hours": figures.idle / HOUR,
        "suspended_hours": figures.suspended / HOUR,
        "queue_wait_hours": figures.queued / HOUR,
        "starts": starts,
        "mean_start_wait_seconds": figures.wait / starts if starts else None,
        "suspends": figures.suspends,
        "resumes": figures.resumes,
    }


def report(
    buckets: Iterable[Bucket],
    *,
    since: float,
    until: float,
    by: str,
    scope: Scope,
    labels: Mapping[str, str],
    groups: Mapping[str, Sequence[str]],
) -> UsagePayload:
    """The report of ``buckets`` from ``since`` to ``until`` by ``by``, with each user's series."""
    by = check_by(by)
    chosen = [bucket for bucket in buckets if bucket.start + bucket.width > since and bucket.start < until]
    sums: dict[str, Figures] = {}
    names: dict[str, str] = {}
    kernels: dict[str, set[str]] = {}
    total = Figures()
    for bucket in chosen:
        total.add(bucket.figures)
        for key, label in _keys(bucket, by, labels, groups):
            sums.setdefault(key, Figures()).add(bucket.figures)
            names[key] = label
            if bucket.kernel_id:
                kernels.setdefault(key, set()).add(bucket.kernel_id)
    rows = [row(key, names[key], figures, len(kernels.get(key, ()))) for key, figures in sums.items()]
    rows.sort(key=lambda entry: (-entry["reserved_gib_hours"], entry["key"]))
    every = {bucket.kernel_id for bucket in chosen if bucket.kernel_id}
    return {
        "since": since,
        "until": until,
        "by": by,
        "scope": scope,
        "rows": rows,
        "total": row("total", "total", total, len(every)),
        "series": series(chosen, since, until),
    }


def _keys(
    bucket: Bucket, by: str, labels: Mapping[str, str], groups: Mapping[str, Sequence[str]]
) -> list[tuple[str, str]]:
    if by == "user":
        return [(bucket.owner, bucket.owner)]
    if by == "group":
        return [(group, group) for group in groups.get(bucket.owner) or [NO_GROUP]]
    if not bucket.kernel_id:
        return [(f"{bucket.owner}/{OLDER_KERNELS}", f"{bucket.owner}: {OLDER_KERNELS}")]
    label = labels.get(bucket.kernel_id, "")
    return [(bucket.kernel_id, f"{bucket.owner}: {label}" if label else bucket.owner)]


def series_step(since: float, until: float, rolled_before: float | None = None) -> float:
    """The width of one point of a chart of ``[since, until)``: about ``SERIES_POINTS`` points,
    a multiple of the buckets (of an hour where the range reaches rolled-up buckets)."""
    unit = ROLLED_SECONDS if rolled_before is not None and since < rolled_before else DETAIL_SECONDS
    wanted = (until - since) / SERIES_POINTS
    return max(unit, math.ceil(wanted / unit) * unit)


def series(buckets: Sequence[Bucket], since: float, until: float) -> UsageSeriesPayload:
    """Each user's mean reserved and used bytes per step from ``since`` to ``until``."""
    rolled = [bucket.start for bucket in buckets if bucket.width > DETAIL_SECONDS]
    step = series_step(since, until, max(rolled) + ROLLED_SECONDS if rolled else None)
    start = bucket_of(since, step)
    count = max(1, math.ceil((until - start) / step))
    per_user: dict[str, tuple[list[float], list[float]]] = {}
    for bucket in buckets:
        index = int((bucket.start - start) // step)
        if not 0 <= index < count:
            continue
        reserved, used = per_user.setdefault(bucket.owner, ([0.0] * count, [0.0] * count))
        reserved[index] += bucket.figures.reserved
        used[index] += bucket.figures.used
    return {
        "start": start,
        "step": step,
        "users": [
            {
                "user": owner,
                "reserved": [round(value / step) for value in reserved],
                "used": [round(value / step) for value in used],
            }
            for owner, (reserved, used) in sorted(per_user.items())
        ],
    }


# ---- as text ------------------------------------------------------------------------------------------

COLUMNS = (
    ("reserved_gib_hours", "reserved GiB·h", "{:.2f}"),
    ("used_gib_hours", "used GiB·h", "{:.2f}"),
    ("used_share", "used %", "{:.0%}"),
    ("busy_hours", "busy h", "{:.2f}"),
    ("idle_hours", "idle h", "{:.2f}"),
    ("suspended_hours", "suspended h", "{:.2f}"),
    ("queue_wait_hours", "queue wait h", "{:.2f}"),
    ("starts", "starts", "{}"),
    ("mean_start_wait_seconds", "mean wait s", "{:.0f}"),
    ("suspends", "suspends", "{}"),
    ("resumes", "resumes", "{}"),
)


def _cell(entry: UsageRowPayload, field: str, form: str) -> str:
    value = entry[field]  # type: ignore[literal-required]
    return "-" if value is None else form.format(value)


def as_table(payload: UsagePayload) -> str:
    """The report as aligned columns, a total last."""
    heading = [payload["by"], *(title for _, title, _ in COLUMNS)]
    lines = [
        [entry["label"], *(_cell(entry, field, form) for field, _, form in COLUMNS)]
        for entry in [*payload["rows"], payload["total"]]
    ]
    widths = [max(len(line[i]) for line in [heading, *lines]) for i in range(len(heading))]

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join(
            [first, *(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))]
        )

    rule = "-" * len(render(heading))
    return "\n".join([render(heading), rule, *(render(line) for line in lines[:-1]), rule, render(lines[-1])])


def as_csv(payload: UsagePayload) -> str:
    """The report as CSV: one line per row (the total last), the payload's field names as header."""
    import csv
    import io

    out = io.StringIO()
    fields = list(payload["total"])
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for entry in [*payload["rows"], payload["total"]]:
        writer.writerow(entry)
    return out.getvalue().rstrip("\n")


__all__ = [
    "BY",
    "NO_GROUP",
    "SINCE_FORMS",
    "Bucket",
    "ReportError",
    "as_csv",
    "as_table",
    "check_by",
    "parse_since",
    "report",
    "row",
    "series",
    "series_step",
    "usage_query",
]
