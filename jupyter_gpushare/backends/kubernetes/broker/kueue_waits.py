"""How long the kernel pods Kueue holds are expected to wait, as the broker sees them.

The broker has what the estimate needs: every kernel pod (its watch), each waiting pod's place
in its ClusterQueue (Kueue's visibility API, read by :mod:`.pods`), and in its accounting file
the holds that ended, when each running pod was placed, and the estimates judged so far. What it
reads for this is the quota: each LocalQueue's ClusterQueue (:class:`~..kueue_reads.QuotaReader`).
The model is :mod:`~jupyter_gpushare.backends.kubernetes.objects.kueue_wait`'s. Each pod's first
estimates (the model's and the naive one) are kept in the accounting file and judged when its pod
is placed, as the local queue's are: which of the two a start is told follows those judgements.

Estimates are worked out every ``ESTIMATE_EVERY`` seconds (a pod Kueue has just gated: at the
next read), not every round: each costs the plays of the queue.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.kubernetes.broker.pod_accounting import PodAccounting
from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster
from jupyter_gpushare.backends.kubernetes.kueue_reads import QuotaReader
from jupyter_gpushare.backends.kubernetes.objects.kueue import QUEUE_LABEL, Place, held_by_kueue
from jupyter_gpushare.backends.kubernetes.objects.kueue_wait import Holder, asks, kueue_estimates, slots
from jupyter_gpushare.backends.kubernetes.objects.pool import read_pod
from jupyter_gpushare.core.placement.wait_estimate import MIN_HISTORY

log = logging.getLogger("jupyter_gpushare.broker")

ESTIMATE_EVERY = 5.0  # seconds between the estimates of the pods Kueue holds


@dataclass(frozen=True)
class Gated:
    """A start whose pod Kueue holds behind its gate: its kernel, owner, the bytes of its size,
    and its pod."""

    kernel_id: str
    owner: str
    memory: int
    pod: Mapping[str, Any]


class KueueWaits:
    """The wait estimates of the broker's starts that Kueue holds (:attr:`expected`)."""

    def __init__(self, cluster: Cluster, accounting: PodAccounting | None) -> None:
        self.quotas = QuotaReader(cluster, log)
        self.accounting = accounting
        # When each kernel whose pod Kueue holds is expected to be admitted (seconds since the
        # epoch), by kernel id; a kernel without an estimate is not in it.
        self.expected: dict[str, float] = {}
        self._estimated: set[str] = set()  # the kernels the last estimates looked at
        self._at = -math.inf

    def estimate(
        self, gated: Iterable[Gated], pods: Iterable[Mapping[str, Any]], places: Mapping[str, Place]
    ) -> None:
        """Estimate the waits of ``gated`` (those whose place, by pod uid, is in ``places``),
        ``pods`` being every kernel pod the broker sees (blocking: a thread of its own)."""
        now_mono = time.monotonic()
        waiting = {one.kernel_id: one for one in gated if _uid(one.pod) in places}
        if not waiting or self.accounting is None or not self.quotas.readable:
            self.expected = {}
            return
        if now_mono - self._at < ESTIMATE_EVERY and set(waiting) <= self._estimated:
            self.expected = {k: when for k, when in self.expected.items() if k in waiting}
            return
        self._at, self._estimated = now_mono, set(waiting)
        history, kept, placed_at = self.accounting.estimate_basis()
        if len(history.holds) < MIN_HISTORY:
            self.expected = {}
            return
        quotas = {
            queue: self.quotas.quota(queue)
            for queue in {str(held_by_kueue(one.pod)) for one in waiting.values()}
        }
        # Our kernel pods Kueue admitted, by the ClusterQueue whose quota they hold.
        admitted: dict[str, list[tuple[Holder, dict[str, int]]]] = {}
        for pod in pods:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            feeds = self.quotas.feeds.get(str(labels.get(QUEUE_LABEL) or ""))
            item = read_pod(dict(pod))
            if feeds is None or held_by_kueue(pod) is not None or item is None or item.ended or item.deleting:
                continue
            holder = Holder(item.kernel_id, item.owner, item.memory or 0, placed_at.get(item.kernel_id))
            admitted.setdefault(feeds, []).append((holder, asks(pod)))
        now = time.time()
        expected: dict[str, float] = {}
        new: dict[str, tuple[float, float]] = {}
        for kernel_id, one in waiting.items():
            quota = quotas.get(str(held_by_kueue(one.pod)))
            if quota is None:
                continue
            ours = admitted.get(quota.cluster_queue, [])
            count = slots(quota, asks(one.pod), [asked for _, asked in ours])
            if count is None:
                continue
            me = Holder(kernel_id, one.owner, one.memory)
            ahead = places[_uid(one.pod)].cluster - 1
            both = kueue_estimates(now, me, ahead, [holder for holder, _ in ours], count, history)
            if both.answer is not None:
                expected[kernel_id] = both.answer
            if kernel_id not in kept and both.model is not None and both.naive is not None:
                new[kernel_id] = (both.model, both.naive)
                told = "the model's" if both.answer == both.model else "the naive one"
                log.info(
                    "Kernel %s: Kueue's quota expected in %.0f s (the model %.0f s, the naive estimate "
                    "%.0f s; told: %s), %d slot(s) in ClusterQueue %s, %d of ours holding, %d ahead",
                    kernel_id,
                    (both.answer or now) - now,
                    both.model - now,
                    both.naive - now,
                    told,
                    count,
                    quota.cluster_queue,
                    len(ours),
                    ahead,
                )
        self.expected = expected
        if new:
            self.accounting.keep_estimates(new)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


__all__ = ["ESTIMATE_EVERY", "Gated", "KueueWaits"]
