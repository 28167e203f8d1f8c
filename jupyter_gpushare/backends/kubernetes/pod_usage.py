"""What the kernel pods use: their own reports, else a HAMi-style monitor's metrics.

A kernel pod reports its GPU use to the server that started it; where it stops reporting (or
never did), the figure comes from ``c.GPUShare.usage_metrics_url``, read on its own clock. One
:class:`PodUsage` per backend, shared by its scoped copies; ``version`` moves with every change
so that the views' caches follow.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice
from jupyter_gpushare.backends.kubernetes.objects.usage import MetricsFormatError, pod_memory_used
from jupyter_gpushare.core.records import UsageReport

log = logging.getLogger("jupyter_gpushare")

REPORTS_KEPT_FOR = 30.0  # seconds a kernel's report counts; older ones mean it stopped reporting
METRICS_TIMEOUT = 5.0


@dataclass
class PodUsage:
    """What kernels reported and what the cluster's metrics say, with a version for caches."""

    reports: dict[str, tuple[UsageReport, float]] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)  # pod name -> bytes
    problem: str | None = None
    version: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, kernel_id: str, report: UsageReport) -> None:
        with self._lock:
            self.reports[kernel_id] = (report, time.monotonic())
            self.version += 1

    def fresh(self, slices: list[PodSlice]) -> dict[str, UsageReport]:
        """The latest usage per kernel: its own fresh report first, else the cluster's metrics."""
        now = time.monotonic()
        found: dict[str, UsageReport] = {}
        for item in slices:
            reported = self.reports.get(item.kernel_id)
            if reported is not None and now - reported[1] <= REPORTS_KEPT_FOR:
                found[item.kernel_id] = reported[0]
            elif item.pod in self.metrics:
                found[item.kernel_id] = UsageReport(self.metrics[item.pod], None, "hami")
        return found

    def read_metrics(self, url: str, namespace: str, metric_names: list[str]) -> None:
        """One read of ``url`` (a HAMi-style monitor's Prometheus text)."""
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as response:
                text = response.read().decode("utf-8", errors="replace")
            metrics = pod_memory_used(text, namespace, metric_names)
        except (urllib.error.URLError, OSError, MetricsFormatError) as error:
            problem = f"cannot read GPU usage from {url}: {error}"
            if problem != self.problem:
                log.warning("jupyter_gpushare: %s", problem)
                self.problem = problem
                self.version += 1
            return
        if self.problem is not None or metrics != self.metrics:
            self.problem, self.metrics = None, metrics
            self.version += 1


__all__ = ["METRICS_TIMEOUT", "REPORTS_KEPT_FOR", "PodUsage"]
