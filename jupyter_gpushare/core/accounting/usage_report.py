"""The usage report: buckets of :mod:`jupyter_gpushare.core.accounting.tally` summed by user, group or kernel,
and the reserved-vs-used series the panel's chart draws. Pure.

The same payload answers ``GET api/gpushare/usage``, ``jupyter gpushare report`` and the
Prometheus counters, so the three cannot disagree. Figures are sums over whole buckets (15
minutes per kernel; an hour per user once older than ``GPUShare.accounting_retention``):
``since`` is rounded down to the bucket it falls in. The doctor's test kernels are summed
apart (``test_kernels``), never in a user's figures.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from jupyter_gpushare.core.accounting.tally import (
    DETAIL_SECONDS,
    ROLLED_SECONDS,
    Figures,
    bucket_of,
    is_test_kernel,
)
from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.payloads import UsagePayload, UsageRowPayload, UsageSeriesPayload
from jupyter_gpushare.core.placement.queue_order import HOUR, gib_hours

By = Literal["user", "group", "kernel"]
Scope = Literal["self", "everyone"]
BY: tuple[By, ...] = ("user", "group", "kernel")
NO_GROUP = "(no group)"
OLDER_KERNELS = "(older kernels)"  # kernels of buckets rolled up by user and hour
ROLLED_TESTS = "(test kernels)"  # the kernel id of the doctor's test kernels rolled up by hour
NO_NOTEBOOK = "no notebook"
SHORT_ID = 8  # characters of a kernel id that tell kernels apart in a table
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


@dataclass(frozen=True)
class KernelInfo:
    """What tells one kernel from another in a report."""

    path: str = ""  # its notebook ("" when it was not started from one)
    kernel_name: str = ""  # its kernelspec
    started_at: float | None = None  # when it first asked for a slice

    @property
    def test(self) -> bool:
        return is_test_kernel(self.kernel_name)


def iso_time(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC, to the second (``2026-12-01T14:03:05Z``)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def row(
    key: str,
    label: str,
    figures: Figures,
    kernels: int,
    owner: str | None = None,
    kernel: KernelInfo | None = None,
) -> UsageRowPayload:
    """One row; ``owner`` and ``kernel`` for a kernel's row (``--by kernel``)."""
    starts = figures.starts
    return {
        "key": key,
        "label": label,
        "owner": owner,
        "started": iso_time(kernel.started_at) if kernel is not None and kernel.started_at else None,
        "notebook": (kernel.path or None) if kernel is not None else None,
        "kernelspec": (kernel.kernel_name or None) if kernel is not None else None,
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
    kernels: Mapping[str, KernelInfo],
    groups: Mapping[str, Sequence[str]],
) -> UsagePayload:
    """The report of ``buckets`` from ``since`` to ``until`` by ``by``, with each user's series;
    the doctor's test kernels summed apart."""
    by = check_by(by)
    chosen: list[Bucket] = []
    tests: list[Bucket] = []
    for bucket in buckets:
        if bucket.start + bucket.width > since and bucket.start < until:
            test = bucket.kernel_id == ROLLED_TESTS or _info(kernels, bucket.kernel_id).test
            (tests if test else chosen).append(bucket)
    sums: dict[str, Figures] = {}
    made: dict[str, tuple[str, str | None, KernelInfo | None]] = {}  # key: (label, owner, kernel)
    counted: dict[str, set[str]] = {}
    total = Figures()
    for bucket in chosen:
        total.add(bucket.figures)
        for key, described in _keys(bucket, by, kernels, groups):
            sums.setdefault(key, Figures()).add(bucket.figures)
            made[key] = described
            if bucket.kernel_id:
                counted.setdefault(key, set()).add(bucket.kernel_id)
    rows = []
    for key, figures in sums.items():
        label, owner, kernel = made[key]
        rows.append(row(key, label, figures, len(counted.get(key, ())), owner, kernel))
    rows.sort(key=lambda entry: (-entry["reserved_gib_hours"], entry["key"]))
    every = {bucket.kernel_id for bucket in chosen if bucket.kernel_id}
    tested = Figures()
    for bucket in tests:
        tested.add(bucket.figures)
    return {
        "since": iso_time(since),
        "until": iso_time(until),
        "by": by,
        "scope": scope,
        "rows": rows,
        "total": row("total", "total", total, len(every)),
        "test_kernels": row(
            "test_kernels",
            "jupyter gpushare doctor's test kernels",
            tested,
            len({bucket.kernel_id for bucket in tests if bucket.kernel_id != ROLLED_TESTS}),
        ),
        "series": series(chosen, since, until),
    }


def _info(kernels: Mapping[str, KernelInfo], kernel_id: str) -> KernelInfo:
    return kernels.get(kernel_id) or KernelInfo()


def _keys(
    bucket: Bucket, by: str, kernels: Mapping[str, KernelInfo], groups: Mapping[str, Sequence[str]]
) -> list[tuple[str, tuple[str, str | None, KernelInfo | None]]]:
    """The rows ``bucket`` counts in: each one's key, and its label, owner and kernel."""
    if by == "user":
        return [(bucket.owner, (bucket.owner, None, None))]
    if by == "group":
        return [(group, (group, None, None)) for group in groups.get(bucket.owner) or [NO_GROUP]]
    if not bucket.kernel_id:
        key = f"{bucket.owner}/{OLDER_KERNELS}"
        return [(key, (f"{bucket.owner}: {OLDER_KERNELS}", bucket.owner, None))]
    kernel = _info(kernels, bucket.kernel_id)
    return [(bucket.kernel_id, (kernel_label(bucket.owner, bucket.kernel_id, kernel), bucket.owner, kernel))]


def kernel_label(owner: str, kernel_id: str, kernel: KernelInfo) -> str:
    """``alice: 3f2a9c1e a.ipynb``, ``alice: 3f2a9c1e no notebook (python3-gpu)``: one kernel's,
    told apart from its owner's other kernels by its short id even without a notebook."""
    return f"{owner}: {kernel_id[:SHORT_ID]} {notebook_words(kernel.path, kernel.kernel_name)}"


def notebook_words(path: str | None, kernelspec: str | None) -> str:
    """A kernel's notebook, or ``no notebook (python3-gpu)`` for one started without one."""
    return path or NO_NOTEBOOK + (f" ({kernelspec})" if kernelspec else "")


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
    ("kernels", "kernels", "{}"),
    ("starts", "starts", "{}"),
    ("mean_start_wait_seconds", "mean wait s", "{:.0f}"),
    ("suspends", "suspends", "{}"),
    ("resumes", "resumes", "{}"),
)
# What a kernel's row says of the kernel, before its figures (``--by kernel``).
KERNEL_COLUMNS = ("kernel", "owner", "started", "notebook")
LEGEND = (
    "kernels: how many kernels held a slice; starts: slices placed, each kernel's first and every "
    "one after it (a restart, a resume, a slice asked for again after it was given back)."
)


def _cell(entry: UsageRowPayload, field: str, form: str) -> str:
    value = entry[field]  # type: ignore[literal-required]
    return "-" if value is None else form.format(value)


def _kernel_cells(entry: UsageRowPayload) -> list[str]:
    """The kernel, owner, start and notebook of a kernel's row (the total's: blank)."""
    if entry["owner"] is None:
        return [entry["label"], "", "", ""]
    if entry["key"].endswith(f"/{OLDER_KERNELS}"):
        return [OLDER_KERNELS, entry["owner"], "-", "-"]
    notebook = notebook_words(entry["notebook"], entry["kernelspec"])
    return [entry["key"][:SHORT_ID], entry["owner"], local_time(entry["started"]), notebook]


def local_time(text: str | None) -> str:
    """An ISO 8601 time of the payload as this machine's local time, to the minute."""
    if text is None:
        return "-"
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.astimezone().strftime("%Y-%m-%d %H:%M")


def as_table(payload: UsagePayload) -> str:
    """The report as aligned columns, a total last, then what the counts mean (and the doctor's
    test kernels, left out of the figures, where there were any)."""
    by_kernel = payload["by"] == "kernel"
    leading = list(KERNEL_COLUMNS) if by_kernel else [payload["by"]]
    heading = [*leading, *(title for _, title, _ in COLUMNS)]
    lines = [
        [
            *(_kernel_cells(entry) if by_kernel else [entry["label"]]),
            *(_cell(entry, field, form) for field, _, form in COLUMNS),
        ]
        for entry in [*payload["rows"], payload["total"]]
    ]
    widths = [max(len(line[i]) for line in [heading, *lines]) for i in range(len(heading))]
    texts = len(leading)

    def render(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i < texts else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-" * len(render(heading))
    table = [
        render(heading),
        rule,
        *(render(line) for line in lines[:-1]),
        rule,
        render(lines[-1]),
        "",
        LEGEND,
    ]
    tests = payload["test_kernels"]
    if tests["starts"]:  # (test kernels rolled up by the hour are no longer told apart: their starts)
        table.append(
            f"Not in the figures above: the test kernels of jupyter gpushare doctor, {tests['starts']} "
            f"start(s), {tests['reserved_gib_hours']:.2f} GiB·h reserved."
        )
    return "\n".join(table)


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
    "ROLLED_TESTS",
    "SINCE_FORMS",
    "Bucket",
    "KernelInfo",
    "ReportError",
    "as_csv",
    "as_table",
    "check_by",
    "iso_time",
    "kernel_label",
    "local_time",
    "notebook_words",
    "parse_since",
    "report",
    "row",
    "series",
    "series_step",
    "usage_query",
]
