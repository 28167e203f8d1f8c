"""A server's pool on the Kubernetes backend: the watched cluster plus what kernel pods report.

The nodes and our kernel pods come from :class:`~jupyter_gpushare.k8s.watch.ClusterWatch`
(list + watch); memory use comes from the kernels themselves (each pod's kernel reports to
``POST api/gpushare/kernels/{id}/usage`` with its own token) and, where configured, from a
HAMi-style monitor's metrics. The views are built by the pure :mod:`jupyter_gpushare.k8s.pool`.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from ..config import GPUShare
from ..k8s.cluster import Cluster, ClusterError, load_configuration
from ..k8s.manifests import server_label
from ..k8s.pool import NodeGPUs, PodSlice, Usage, held_by_user, kernel_view, pool_view, read_node, read_pod
from ..k8s.presets import resolve_preset
from ..k8s.usage import MetricsFormatError, pod_memory_used
from ..k8s.watch import ClusterWatch

log = logging.getLogger("jupyter_gpushare")

REPORTS_KEPT_FOR = 30.0  # seconds a kernel's report counts; older ones mean it stopped reporting
METRICS_TIMEOUT = 5.0


class ClusterPool:
    """The cluster as this server shows it (one per server process)."""

    def __init__(self, settings: GPUShare, server_id: str, owner: str) -> None:
        self.settings = settings
        self.owner = owner
        self.server_label = server_label(server_id)
        self.preset = resolve_preset(settings.resource_preset, settings.resource_names)
        self.watch: ClusterWatch | None = None
        self.problem: str | None = None
        self._reports: dict[str, tuple[Usage, float]] = {}
        self._metrics: dict[str, int] = {}  # pod name -> bytes, from usage_metrics_url
        self._metrics_problem: str | None = None
        self._usage_version = 0
        self._stop = threading.Event()
        try:
            found = load_configuration()
            cluster = Cluster(settings.namespace or found.namespace, configuration=found.configuration)
        except ClusterError as error:
            self.problem = str(error)
            log.warning("jupyter_gpushare: no cluster pool: %s", error)
            return
        self.namespace = cluster.namespace
        self.watch = ClusterWatch(cluster).start()
        if settings.usage_metrics_url:
            threading.Thread(target=self._read_metrics_forever, name="gpushare-metrics", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self.watch is not None:
            self.watch.stop()

    # ---- what the watch holds -------------------------------------------------------------

    def nodes(self) -> list[NodeGPUs]:
        if self.watch is None:
            return []
        read = (read_node(node, self.preset) for node in self.watch.nodes.items())
        return sorted((node for node in read if node is not None), key=lambda node: node.name)

    def slices(self) -> list[PodSlice]:
        if self.watch is None:
            return []
        read = (read_pod(pod) for pod in self.watch.pods.items())
        return sorted((item for item in read if item is not None), key=lambda item: item.created)

    def marker(self) -> tuple[int, int]:
        """Changes whenever a view could: a watch event or a usage report."""
        return (self.watch.version if self.watch else -1, self._usage_version)

    def current_problem(self) -> str | None:
        problems = [self.problem, self.watch.problem if self.watch else None, self._metrics_problem]
        return "; ".join(problem for problem in problems if problem) or None

    # ---- usage ----------------------------------------------------------------------------

    def report(self, kernel_id: str, usage: Usage) -> None:
        self._reports[kernel_id] = (usage, time.monotonic())
        self._usage_version += 1

    def usage(self, slices: Iterable[PodSlice]) -> dict[str, Usage]:
        """The latest usage per kernel: its own fresh report first, else the cluster's metrics."""
        now = time.monotonic()
        found: dict[str, Usage] = {}
        for item in slices:
            reported = self._reports.get(item.kernel_id)
            if reported is not None and now - reported[1] <= REPORTS_KEPT_FOR:
                found[item.kernel_id] = reported[0]
            elif item.pod in self._metrics:
                found[item.kernel_id] = Usage(self._metrics[item.pod], None, "hami")
        return found

    def _read_metrics_forever(self) -> None:
        while not self._stop.is_set():
            self.read_metrics()
            self._stop.wait(max(self.settings.sample_interval, 1.0))

    def read_metrics(self) -> None:
        url = self.settings.usage_metrics_url
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as response:
                text = response.read().decode("utf-8", errors="replace")
            metrics = pod_memory_used(text, self.namespace, self.settings.usage_metric_names)
        except (urllib.error.URLError, OSError, MetricsFormatError) as error:
            problem = f"cannot read GPU usage from {url}: {error}"
            if problem != self._metrics_problem:
                log.warning("jupyter_gpushare: %s", problem)
                self._metrics_problem = problem
                self._usage_version += 1
            return
        if self._metrics_problem is not None:
            self._metrics_problem = None
            self._usage_version += 1
        if metrics != self._metrics:
            self._metrics = metrics
            self._usage_version += 1

    # ---- views ----------------------------------------------------------------------------

    def pool(self) -> dict[str, Any]:
        slices = self.slices()
        return pool_view(
            self.nodes(),
            slices,
            self.preset,
            self.usage(slices),
            viewer=self.owner,
            problem=self.current_problem(),
        )

    def kernels(
        self,
        own: set[str],
        details: Mapping[str, str],
        names: Mapping[str, tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """This server's kernel pods (by label, or by id for kernels this process runs)."""
        slices = self.slices()
        nodes = self.nodes()
        usage = self.usage(slices)
        views = []
        for item in slices:
            if item.server != self.server_label and item.kernel_id not in own:
                continue
            if item.ended or item.deleting:
                continue  # its kernel is ending; the server lists it until it is gone
            kernel_name, path = names.get(item.kernel_id, ("", ""))
            views.append(
                kernel_view(
                    item,
                    nodes,
                    slices,
                    usage.get(item.kernel_id),
                    viewer=self.owner,
                    kernel_name=kernel_name,
                    path=path,
                    detail=details.get(item.kernel_id),
                )
            )
        return views

    def held_by_user(self, owner: str, excluding: str | None = None) -> int:
        return held_by_user(self.slices(), owner, excluding)

    def slice_of(self, kernel_id: str) -> PodSlice | None:
        return next((item for item in self.slices() if item.kernel_id == kernel_id), None)
