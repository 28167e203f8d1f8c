"""What the broker's accounting file keeps of each kernel pod, and how it changed since. Pure.

The Kubernetes broker sees every kernel pod (its list+watch) and every start still waiting in its
own queue; every few seconds it writes what it sees into its accounting file's ``slices`` table
(:mod:`jupyter_gpushare.backends.kubernetes.broker.pod_accounting`), whose triggers record the
accounting's events as the node ledger's do: a slice is *queued* while its start waits (in the
broker's queue, for Kueue's quota, or for the scheduler), *running* — held — from the moment the
scheduler bound its pod to a node until the pod ends or goes. :func:`accounted` says what a
look shows; :func:`changes` what to write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, epoch_seconds
from jupyter_gpushare.core.records import UsageReport


@dataclass(frozen=True)
class Accounted:
    """A kernel's slice as a look of the broker shows it (a row of the file's ``slices``)."""

    kernel_id: str
    owner: str
    state: str  # "queued" (its start waits) or "running" (its pod is bound to a node)
    memory: int  # bytes reserved (0 where the pod names no size: a whole card's)
    used: int | None  # bytes in use, as the kernel last reported (or the cluster's metrics)
    requested_at: float | None  # seconds since the epoch: when its start was asked for


@dataclass(frozen=True)
class Waiting:
    """A start in the broker's own queue, whose pod is not made yet."""

    kernel_id: str
    owner: str
    memory: int | None
    requested_at: float  # seconds since the epoch


@dataclass
class Changes:
    """What to write so that the file shows a look: rows added, placed, changed and gone."""

    added: list[Accounted] = field(default_factory=list)
    placed: list[Accounted] = field(default_factory=list)  # queued before, running now
    resized: list[Accounted] = field(default_factory=list)
    used: list[Accounted] = field(default_factory=list)  # running, its use changed
    gone: list[str] = field(default_factory=list)  # kernel ids: ended, or withdrawn

    def __bool__(self) -> bool:
        return bool(self.added or self.placed or self.resized or self.used or self.gone)


def accounted(
    slices: Iterable[PodSlice],
    waiting: Iterable[Waiting],
    usage: Mapping[str, UsageReport],
    requested: Mapping[str, float],
) -> dict[str, Accounted]:
    """What the broker sees now, by kernel id: its kernel pods that have not ended (a pod being
    deleted has ended: its GPU is given back as its kernel stops) and the starts in its queue.
    ``requested``: when the broker was asked for each start it knows; else a waiting pod's
    creation time says it (a broker restarted meanwhile), and a pod found placed counts no wait."""
    seen: dict[str, Accounted] = {}
    for start in waiting:
        seen[start.kernel_id] = Accounted(
            start.kernel_id, start.owner, "queued", start.memory or 0, None, start.requested_at
        )
    for item in slices:
        if item.ended or item.deleting:
            continue
        report = usage.get(item.kernel_id)
        asked = requested.get(item.kernel_id)
        if asked is None and not item.placed:
            # A start the broker does not know (made before it started) waits since its pod was
            # made; one found placed already waited it does not know how long: no wait counted.
            asked = epoch_seconds(item.created) or None
        seen[item.kernel_id] = Accounted(
            item.kernel_id,
            item.owner,
            "running" if item.placed else "queued",
            item.memory or 0,
            report.memory_used if report is not None and item.placed else None,
            asked,
        )
    return seen


def changes(before: Mapping[str, Accounted], now: Mapping[str, Accounted]) -> Changes:
    """What turns the rows ``before`` into ``now``. A running slice whose kernel waits again (a
    new pod for a restarted kernel) ends its hold and starts a new wait."""
    out = Changes()
    for kernel_id, was in before.items():
        new = now.get(kernel_id)
        if new is None or (was.state == "running" and new.state == "queued") or new.owner != was.owner:
            out.gone.append(kernel_id)
    for kernel_id, new in now.items():
        old = before.get(kernel_id)
        if old is None or kernel_id in out.gone:
            out.added.append(new)
        elif old.state == "queued" and new.state == "running":
            out.placed.append(new)
        elif new.state == "running":
            if new.memory != old.memory:
                out.resized.append(new)
            if new.used is not None and new.used != old.used:
                out.used.append(new)
    return out


__all__ = ["Accounted", "Changes", "Waiting", "accounted", "changes"]
