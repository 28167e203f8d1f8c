"""The scheduler: binds each pending pod to the first node with room for its limits, or says
why none has, in the words of the Kubernetes scheduler.

The node (node.py) hands it the pods that have no node yet and name a scheduler it plays
(``default-scheduler`` and ``hami-scheduler`` unless a test says otherwise). In a cluster with
a DRA driver (dra.py) a pod waits until the claims it names exist, nodes are tried in the order
its claims' ``firstAvailable`` entries prefer, and a node is taken only where its claims can be
allocated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .api import ApiServer
from .events import post_event
from .nodes import SimNode, pod_limits, quantity
from .resources import CANNOT_ALLOCATE, PODS, now

if TYPE_CHECKING:
    from .dra import DraSimulation


class Scheduler:
    """Places pods on ``nodes`` by their resource limits against what bound, unfinished pods
    already hold."""

    def __init__(
        self, api: ApiServer, nodes: list[SimNode], names: Iterable[str], dra: DraSimulation | None = None
    ) -> None:
        self.api = api
        self.dra = dra
        self.nodes = nodes
        self.names = set(names)
        self._unschedulable: set[str] = set()  # pods already told why: one event each, as kube does

    def takes(self, pod: dict[str, Any]) -> bool:
        """Whether the pod names a scheduler this one plays."""
        return (pod.get("spec") or {}).get("schedulerName", "default-scheduler") in self.names

    async def schedule(self, pod: dict[str, Any]) -> None:
        if self.dra is not None and not await self.dra.claims_ready(self.api, pod):
            return  # the scheduler waits until the pod's ResourceClaims exist
        async with self.api._lock:
            bound = [p for p in self.api.items(PODS) if (p.get("spec") or {}).get("nodeName")]
        wanted = pod_limits(pod)
        reasons: dict[str, int] = {}
        # Under DRA the scheduler prefers nodes where a claim's earlier firstAvailable entries fit.
        nodes = self.nodes if self.dra is None else await self.dra.rank_nodes(self.api, pod, self.nodes)
        for node in nodes:
            used: dict[str, float] = {}
            for other in bound:
                if other["spec"]["nodeName"] == node.name and other["status"].get("phase") not in (
                    "Succeeded",
                    "Failed",
                ):
                    for name, amount in pod_limits(other).items():
                        used[name] = used.get(name, 0.0) + amount
            short = [
                name
                for name, amount in sorted(wanted.items())
                if amount > quantity(node.allocatable.get(name, "0")) - used.get(name, 0.0)
            ]
            if not short and (self.dra is None or await self.dra.allocate(self.api, pod, node.name)):
                await self._bind(pod, node)
                return
            reason = f"Insufficient {short[0]}" if short else CANNOT_ALLOCATE
            reasons[reason] = reasons.get(reason, 0) + 1
        summary = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        message = f"0/{len(self.nodes)} nodes are available: {summary}."
        name = pod["metadata"]["name"]
        if name in self._unschedulable:
            return
        self._unschedulable.add(name)
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], name)
            if current is None:
                return
            current["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": now(),
                }
            ]
            await self.api.store(PODS, current)
        await post_event(self.api, pod, "FailedScheduling", message, "Warning", "default-scheduler")

    async def _bind(self, pod: dict[str, Any], node: SimNode) -> None:
        self._unschedulable.discard(pod["metadata"]["name"])
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            if current is None:
                return
            current["spec"]["nodeName"] = node.name
            current["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
            ]
            await self.api.store(PODS, current)
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        await post_event(
            self.api,
            pod,
            "Scheduled",
            f"Successfully assigned {namespace}/{name} to {node.name}",
            "Normal",
            "default-scheduler",
        )
