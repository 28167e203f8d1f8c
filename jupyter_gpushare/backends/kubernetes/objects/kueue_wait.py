"""How long a kernel pod Kueue holds will wait for quota: the local queue's wait estimate
(:mod:`jupyter_gpushare.core.placement.wait_estimate`) on Kueue's terms. Pure.

Kueue admits a workload when its ClusterQueue has unused quota for everything it asks; kernel
pods of one deployment ask alike (one GPU, or one time-sliced or MPS share of one, and the same
CPU and memory), so the quota is modelled as **slots**: how many such pods the ClusterQueue's
nominal quota holds at once, after what workloads that are not our kernels reserve now (those
are taken to go on holding it: their ends are not known to us). The resource that leaves the
fewest slots decides (:func:`slots`). A kernel pod admitted in that ClusterQueue holds one slot
from when it was placed; the waiting kernel stands behind the workloads ahead of it in the
ClusterQueue (Kueue's visibility API says how many: ours or not), each taking a slot as one
frees, as Kueue admits them in order (its StrictFIFO; BestEffortFIFO may let a smaller one past,
which slots of one size cannot).

The slots become the cards of the local estimate, each pod asking for one whole card: the plays
(when each held kernel ends, drawn from how long kernels of about its size were held and how long
it has been held so far), the check against the naive estimate — place in line × the median hold
/ the slots — and the judging of both by the starts placed since, all as on a team's box. A
workload ahead whose hold has not begun is drawn from every hold: its size is not known (the
slot stands for it, larger than any kernel).

Not modelled: borrowing from a cohort beyond the nominal quota (slots held by borrowed quota count
as held, none are added for quota still to borrow), preemption, and several flavors of one
resource (their quotas are added up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.dra_pool import parse_quantity
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.placement.allocator import Held, Policy, Request
from jupyter_gpushare.core.placement.wait_estimate import Estimates, History, estimates
from jupyter_gpushare.core.sizes import Size

# The bytes of a slot, as a card of the estimate: larger than any kernel (one pod takes it whole,
# and a hold drawn for a slot's size is drawn from every hold).
SLOT = 1 << 60


@dataclass(frozen=True)
class Quota:
    """A ClusterQueue's quota as the estimate reads it: per resource, the nominal quota summed
    over its flavors, and what its admitted workloads reserve now (whole units each)."""

    cluster_queue: str
    nominal: Mapping[str, int]
    reserved: Mapping[str, int]


@dataclass(frozen=True)
class Holder:
    """A kernel pod holding quota (admitted), or one waiting for it: its kernel, owner, the
    bytes its size stands for, and when it was placed (seconds since the epoch; None: not yet)."""

    kernel_id: str
    owner: str
    memory: int
    since: float | None = None


def quota_of(cluster_queue: Mapping[str, Any]) -> Quota:
    """The :class:`Quota` of a ClusterQueue object (``spec.resourceGroups``, and
    ``status.flavorsReservation``: what Kueue counts when it admits)."""
    nominal: dict[str, int] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                amount = parse_quantity(resource.get("nominalQuota"))
                if resource.get("name") and amount is not None:
                    nominal[str(resource["name"])] = nominal.get(str(resource["name"]), 0) + amount
    reserved: dict[str, int] = {}
    for flavor in (cluster_queue.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            amount = parse_quantity(resource.get("total"))
            if resource.get("name") and amount is not None:
                reserved[str(resource["name"])] = reserved.get(str(resource["name"]), 0) + amount
    name = str((cluster_queue.get("metadata") or {}).get("name") or "?")
    return Quota(name, nominal, reserved)


def asks(pod: Mapping[str, Any]) -> dict[str, int]:
    """What a pod asks of each resource, as Kueue counts it: its containers' requests added up
    (a limit where no request is given), whole units (a fraction of a CPU counts as none)."""
    asked: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        given = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, quantity in given.items():
            amount = parse_quantity(quantity)
            if amount:
                asked[str(name)] = asked.get(str(name), 0) + amount
    return asked


def slots(quota: Quota, asked: Mapping[str, int], ours: Sequence[Mapping[str, int]]) -> int | None:
    """How many pods asking ``asked`` the ClusterQueue holds at once for our kernels: for each
    resource it covers, its nominal quota less what others than ``ours`` (the asks of our kernel
    pods it admitted) reserve, in asks; the fewest decide. None: it covers nothing the pod asks
    (no model of it)."""
    fewest: int | None = None
    for name, amount in asked.items():
        if name not in quota.nominal or amount <= 0:
            continue
        others = max(0, quota.reserved.get(name, 0) - sum(one.get(name, 0) for one in ours))
        count = max(0, quota.nominal[name] - others) // amount
        fewest = count if fewest is None else min(fewest, count)
    return fewest


def kueue_estimates(
    now: float,
    me: Holder,
    ahead: int,
    held: Sequence[Holder],
    slot_count: int,
    history: History,
) -> Estimates:
    """When ``me`` is expected to be admitted (the module's text), waiting behind ``ahead``
    workloads in its ClusterQueue, with ``held`` our kernel pods holding its quota and
    ``slot_count`` slots: both estimates and the one answered (the caller keeps them to judge)."""
    count = max(slot_count, len(held))  # borrowed quota holds slots too
    if count <= 0:
        return Estimates(None, None, None)
    devices = [Device(index, f"kueue-slot-{index}", "quota slot", SLOT) for index in range(count)]
    holding = [
        Held(one.kernel_id, one.owner, devices[index].uuid, devices[index].uuid, one.memory, whole_card=True)
        for index, one in enumerate(held)
    ]
    since = {one.kernel_id: one.since for one in held if one.since is not None}
    line = [
        Request(f"ahead-{number}", "", Size("whole", Decimal(1), "whole"), "exclusive")
        for number in range(ahead)
    ]
    size = Size("bytes", Decimal(max(me.memory, 1)), "its size")
    return estimates(
        now,
        Request(me.kernel_id, me.owner, size, "exclusive"),
        line,
        devices,
        holding,
        since,
        history,
        Policy(),
    )


__all__ = ["Holder", "Quota", "asks", "kueue_estimates", "quota_of", "slots"]
