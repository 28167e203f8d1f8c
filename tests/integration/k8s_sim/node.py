"""The simulated nodes at work: registers them with the API server, then, every ``interval``,
lets the scheduler place new pods and the kubelet run, watch and stop the bound ones — all
through the API server's store, as the real components act through the API.

The cluster (cluster.py) runs :meth:`Node.run` as a task on its event loop; tests read
``cluster.node.running`` and ``cluster.node.violations`` and call ``cluster.node.oom_kill``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from .api import ApiServer
from .dra import DraSimulation
from .kubelet import Kubelet, Running
from .nodes import SimNode
from .resources import NODES, PODS
from .scheduler import Scheduler


class Node:
    """Scheduler and kubelet of a few simulated nodes, acting through the API server's store."""

    def __init__(
        self,
        api: ApiServer,
        nodes: list[SimNode],
        workdir: Path,
        *,
        schedulers: Iterable[str] = ("default-scheduler", "hami-scheduler"),
        broken_images: Iterable[str] = (),
        interval: float = 0.05,
        dra: DraSimulation | None = None,
    ) -> None:
        self.api = api
        self.dra = dra  # the DRA part of scheduler and controllers, where the cluster has a driver
        self.nodes = nodes
        self.interval = interval
        self.violations: list[str] = []  # what a real cluster would refuse or an error of ours
        self.scheduler = Scheduler(api, nodes, schedulers, dra)
        self.kubelet = Kubelet(api, workdir, self.violations, broken_images)

    @property
    def running(self) -> dict[str, Running]:
        """The pods whose containers run, by uid."""
        return self.kubelet.running

    @property
    def logs(self) -> dict[str, Path]:
        """Each pod's container output, by pod name."""
        return self.kubelet.logs

    async def run(self) -> None:
        async with self.api._lock:
            for node in self.nodes:
                await self.api.add(NODES, node.manifest())
        if self.dra is not None:
            await self.dra.publish(self.api)
        while True:
            try:
                await self.tick()
            except Exception as error:  # keep the node alive; the test sees the violation
                self.violations.append(f"node simulator error: {error!r}")
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        async with self.api._lock:
            pods = self.api.items(PODS)
        if self.dra is not None:
            await self.dra.collect(self.api, pods)
        await self.kubelet.forget({pod["metadata"]["uid"] for pod in pods})
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                await self.kubelet.terminate(pod)
            elif not (pod.get("spec") or {}).get("nodeName"):
                if self.scheduler.takes(pod):
                    await self.scheduler.schedule(pod)
            else:
                await self.kubelet.sync(pod)

    async def oom_kill(self, name: str) -> None:
        """The kernel of pod ``name`` killed as the OOM killer does: its pod fails ``OOMKilled``."""
        await self.kubelet.oom_kill(name)

    async def shutdown(self) -> None:
        await self.kubelet.shutdown()
