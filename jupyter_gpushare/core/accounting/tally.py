"""What kernels cost, from what happened to their slices: the accounting's arithmetic. Pure.

The node ledger records each change of a slice as an :class:`Event` (sqlite triggers, in the very
transaction that makes the change: see :mod:`jupyter_gpushare.backends.accounting`): a request queued, a
slice placed, resized, its measured use changed, ended; a kernel suspended or resumed; a cell
started or ended (the kernel's own report). :func:`fold` turns them, in order, into

* one :class:`KernelAccount` per kernel — what it is doing now and since when;
* :class:`Figures` per kernel and 15-minute bucket — reserved and used byte-seconds, seconds busy
  (a cell running while it holds a slice), idle (holding a slice, no cell running), suspended and
  queued, the waits of its starts, its suspends and resumes;
* the :class:`Hold` of every slice that ended (how long slices are held: the wait estimates);
* the spans of reserved memory per user, for the decayed usage fair share orders the queue by.

Time is split exactly at bucket boundaries, so a total over any set of buckets is the integral
of what was held over that time. What an open account accrued since its last fold is worked
out the same way when it is read (:func:`open_figures`), never stored ahead of time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

DETAIL_SECONDS = 900.0  # the width of a bucket kept per kernel
# The kernelspec ``jupyter gpushare doctor`` starts its test kernel with (doctor/kernel.py): its
# slice is still held and accounted, but the reports and counters keep it out of users' figures.
TEST_KERNEL_NAME = "gpushare-doctor"
ROLLED_SECONDS = 3600.0  # the width of a bucket kept per user, once older than the retention

EVENT_KINDS = (
    "queued",
    "placed",
    "resized",
    "used",
    "ended",
    "withdrawn",
    "suspended",
    "unsuspended",
    "busy",
    "idle",
)
Phase = Literal["queued", "running", "suspended", "gone"]


@dataclass(frozen=True)
class Event:
    """One change, as the ledger recorded it."""

    at: float  # seconds since the epoch
    kernel_id: str
    owner: str
    what: str  # one of EVENT_KINDS
    memory: int | None = None  # bytes reserved (placed, resized)
    used: int | None = None  # bytes in use (placed, used)
    path: str = ""  # the kernel's notebook ("" without one: not started from a notebook)
    # When the request was made (placed, withdrawn): the ledger records no event when a request
    # is queued, so a start pays for two records, not three; its wait is known from this.
    requested_at: float | None = None
    kernel_name: str = ""  # its kernelspec (queued, placed, ended, suspended)


@dataclass(frozen=True)
class KernelAccount:
    """What a kernel is doing now, accounted up to ``since``."""

    kernel_id: str
    owner: str
    path: str  # its notebook, "" without one
    phase: Phase
    since: float
    memory: int = 0  # bytes reserved while running
    used: int = 0  # bytes in use while running, as last sampled
    busy: bool = False  # a cell runs (the kernel's own report)
    queued_at: float | None = None  # when the current wait began
    placed_at: float | None = None  # when the current hold began
    resuming: bool = False  # its request follows a suspension: placing it is a resume
    released: bool = False  # it just gave its slice back: a suspension now is a new one
    kernel_name: str = ""  # its kernelspec
    started_at: float | None = None  # when its first request was made (the report's "started")

    @property
    def test(self) -> bool:
        return is_test_kernel(self.kernel_name)


@dataclass
class Figures:
    """What one kernel (or user, or bucket) accrued."""

    reserved: float = 0.0  # byte-seconds
    used: float = 0.0  # byte-seconds
    busy: float = 0.0  # seconds
    idle: float = 0.0
    suspended: float = 0.0
    queued: float = 0.0  # seconds waiting in the queue
    wait: float = 0.0  # seconds the starts placed here had waited
    starts: int = 0  # slices placed (resumes included)
    suspends: int = 0
    resumes: int = 0

    def add(self, other: Figures) -> Figures:
        for name in FIGURES:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in FIGURES)

    @classmethod
    def of(cls, values: Iterable[float]) -> Figures:
        """Figures from their values in the order of ``FIGURES`` (a stored row)."""
        figures = cls()
        for name, value in zip(FIGURES, values, strict=True):
            setattr(figures, name, int(value) if name in COUNTS else float(value))
        return figures


FIGURES = tuple(f.name for f in dataclasses.fields(Figures))
COUNTS = frozenset({"starts", "suspends", "resumes"})
BucketKey = tuple[float, str, str]  # (bucket start, kernel id, owner)


@dataclass(frozen=True)
class Hold:
    """A slice from its placement to its end (release, suspension, or the kernel's end)."""

    ended_at: float
    owner: str
    memory: int
    seconds: float


@dataclass
class Folded:
    """The outcome of :func:`fold`."""

    accounts: dict[str, KernelAccount]
    buckets: dict[BucketKey, Figures] = field(default_factory=dict)
    holds: list[Hold] = field(default_factory=list)
    spans: list[tuple[str, float, float, int]] = field(default_factory=list)  # (owner, start, end, bytes)


def is_test_kernel(kernel_name: str) -> bool:
    """Whether a kernel of this kernelspec is the doctor's test kernel, which is nobody's use:
    its slice is held and counts in fair share, but it stays out of users' figures."""
    return kernel_name == TEST_KERNEL_NAME


def bucket_of(at: float, width: float = DETAIL_SECONDS) -> float:
    return math.floor(at / width) * width


def pieces(start: float, end: float, width: float = DETAIL_SECONDS) -> Iterator[tuple[float, float]]:
    """``[start, end)`` cut at bucket boundaries: ``(bucket start, seconds in it)`` each."""
    at = start
    while at < end:
        bucket = bucket_of(at, width)
        stop = min(end, bucket + width)
        yield bucket, stop - at
        at = stop


def fold(accounts: Mapping[str, KernelAccount], events: Iterable[Event]) -> Folded:
    """Apply ``events`` (in the order they happened) to ``accounts``."""
    folded = Folded(dict(accounts))
    for event in events:
        account = folded.accounts.get(event.kernel_id)
        at = event.at if account is None else max(event.at, account.since)
        if account is not None:
            account = _accrue(account, at, folded)
        changed = _apply(account, event, at, folded)
        if changed is not None:
            folded.accounts[event.kernel_id] = changed
    return folded


def open_figures(accounts: Iterable[KernelAccount], now: float) -> dict[BucketKey, Figures]:
    """What open accounts accrued from their last fold up to ``now`` (computed, not stored)."""
    scratch = Folded({})
    for account in accounts:
        _accrue(account, now, scratch)
    return scratch.buckets


def _accrue(account: KernelAccount, to: float, folded: Folded) -> KernelAccount:
    """Add what ``account`` accrued from its ``since`` up to ``to``; the account as of ``to``."""
    if to <= account.since or account.phase == "gone":
        return account  # (a gone account keeps the time it went: a wait since then is its next)
    for bucket, seconds in pieces(account.since, to):
        figures = folded.buckets.setdefault((bucket, account.kernel_id, account.owner), Figures())
        if account.phase == "running":
            figures.reserved += account.memory * seconds
            figures.used += account.used * seconds
            if account.busy:
                figures.busy += seconds
            else:
                figures.idle += seconds
        elif account.phase == "suspended":
            figures.suspended += seconds
        else:
            figures.queued += seconds
    if account.phase == "running" and account.memory:
        folded.spans.append((account.owner, account.since, to, account.memory))
    return dataclasses.replace(account, since=to)


def _count(folded: Folded, account: KernelAccount | None, event: Event, at: float) -> Figures:
    owner = account.owner if account is not None else event.owner
    return folded.buckets.setdefault((bucket_of(at), event.kernel_id, owner), Figures())


def _waited(folded: Folded, event: Event, start: float, end: float) -> None:
    """Add the seconds a request waited, ``[start, end)``, to its buckets."""
    for bucket, seconds in pieces(start, end):
        folded.buckets.setdefault((bucket, event.kernel_id, event.owner), Figures()).queued += seconds


def _identity(account: KernelAccount | None, event: Event, at: float) -> tuple[str, float]:
    """What a kernel's new account keeps of who it is: its kernelspec, and when it first asked."""
    if account is not None and account.started_at is not None:
        started = account.started_at
    else:
        started = event.requested_at if event.requested_at is not None else at
    return event.kernel_name or (account.kernel_name if account else ""), started


def _apply(account: KernelAccount | None, event: Event, at: float, folded: Folded) -> KernelAccount | None:
    """The account after ``event`` (None: unchanged)."""
    what = event.what
    phase = account.phase if account is not None else None
    kernel_name, started = _identity(account, event, at)
    if what == "queued":
        if phase not in (None, "gone"):
            return None  # a restart keeps its row: the request already waits or runs
        return KernelAccount(
            event.kernel_id,
            event.owner,
            event.path or (account.path if account else ""),
            "queued",
            at,
            busy=account.busy if account else False,
            queued_at=at,
            resuming=account.resuming if account else False,
            kernel_name=kernel_name,
            started_at=started,
        )
    if what == "placed":
        figures = _count(folded, account, event, at)
        figures.starts += 1
        if account is not None and account.phase == "queued":
            figures.wait += at - (account.queued_at if account.queued_at is not None else at)
        elif event.requested_at is not None and phase != "running":
            # The wait is known from the request's time: accrue it now.
            start = min(
                at, max(event.requested_at, account.since if account is not None else event.requested_at)
            )
            _waited(folded, event, start, at)
            figures.wait += at - min(at, event.requested_at)
        if account is not None and account.resuming:
            figures.resumes += 1
        return KernelAccount(
            event.kernel_id,
            event.owner,
            event.path or (account.path if account else ""),
            "running",
            at,
            memory=event.memory or 0,
            used=event.used or 0,
            busy=account.busy if account else False,
            placed_at=at,
            kernel_name=kernel_name,
            started_at=started,
        )
    if what == "withdrawn":  # a request that ended unplaced: timed out, cancelled, a failed resume
        if phase == "queued":
            what = "ended"  # its wait was accrued as it went (a "queued" event opened it)
        else:
            if event.requested_at is not None:
                start = max(event.requested_at, account.since) if account is not None else event.requested_at
                _waited(folded, event, min(start, at), at)
            return None if account is None else dataclasses.replace(account, since=at, released=False)
    if account is None:
        if what == "suspended":  # accounting began while the kernel was running
            _count(folded, account, event, at).suspends += 1
            return KernelAccount(
                event.kernel_id,
                event.owner,
                event.path,
                "suspended",
                at,
                kernel_name=kernel_name,
                started_at=started,
            )
        return None
    if what == "resized" and phase == "running":
        return dataclasses.replace(account, memory=event.memory or 0)
    if what == "used" and phase == "running":
        return dataclasses.replace(account, used=event.used or 0)
    if what == "ended":
        if phase == "running":
            placed = account.placed_at if account.placed_at is not None else at
            folded.holds.append(Hold(at, account.owner, account.memory, at - placed))
            return dataclasses.replace(
                account, phase="gone", memory=0, used=0, placed_at=None, released=True, resuming=False
            )
        if phase == "queued":  # withdrawn, timed out, or a resume that found no slice
            return dataclasses.replace(account, phase="gone", queued_at=None, released=False)
        return None
    if what == "suspended":
        if account.released or phase != "gone" or not account.resuming:
            # A new suspension (not a failed resume going back to sleep).
            _count(folded, account, event, at).suspends += 1
        return dataclasses.replace(account, phase="suspended", released=False, resuming=False)
    if what == "unsuspended" and phase == "suspended":
        return dataclasses.replace(account, phase="gone", resuming=True)
    if what in ("busy", "idle"):
        return dataclasses.replace(account, busy=what == "busy")
    return None


# ---- decay: recent use for fair share --------------------------------------------------------------


def decayed(value: float, at: float, now: float, half_life: float) -> float:
    """``value`` (as of ``at``) as it counts at ``now``: halved every ``half_life`` seconds."""
    return value * 2.0 ** (-(now - at) / half_life) if now > at else value


def span_weight(start: float, end: float, now: float, half_life: float) -> float:
    """Seconds of ``[start, end)`` as they count at ``now`` (each halved every half life)."""
    if end <= start:
        return 0.0
    rate = math.log(2) / half_life
    return (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate


def add_spans(
    value: float, at: float, spans: Iterable[tuple[float, float, int]], half_life: float
) -> tuple[float, float]:
    """``value`` as of ``at`` plus ``spans`` of reserved bytes, as of the latest of them."""
    spans = list(spans)
    now = max([at, *(end for _, end, _ in spans)])
    total = decayed(value, at, now, half_life)
    for start, end, memory in spans:
        total += memory * span_weight(start, end, now, half_life)
    return total, now


def recent_use(
    stored: Mapping[str, tuple[float, float]],
    running: Iterable[KernelAccount],
    now: float,
    half_life: float,
) -> dict[str, float]:
    """Each owner's decayed reserved byte-seconds at ``now``: what was folded (``owner ->
    (value, as of)``) and what running slices held since their last fold."""
    usage = {owner: decayed(value, at, now, half_life) for owner, (value, at) in stored.items()}
    for account in running:
        if account.phase == "running" and account.memory:
            usage[account.owner] = usage.get(account.owner, 0.0) + account.memory * span_weight(
                account.since, now, now, half_life
            )
    return usage


__all__ = [
    "DETAIL_SECONDS",
    "EVENT_KINDS",
    "FIGURES",
    "ROLLED_SECONDS",
    "TEST_KERNEL_NAME",
    "Event",
    "Figures",
    "Folded",
    "Hold",
    "KernelAccount",
    "add_spans",
    "bucket_of",
    "decayed",
    "fold",
    "is_test_kernel",
    "open_figures",
    "pieces",
    "recent_use",
    "span_weight",
]
