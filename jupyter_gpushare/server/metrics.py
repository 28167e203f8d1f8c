"""Prometheus gauges and counters ``jupyter_gpushare_*`` on the server's own ``/metrics``.

A collector reads the pool and kernels when Prometheus scrapes, so the series are never stale
and a finished kernel's series disappears with it. Labels carry device and owner so a Grafana
board can group by either; other users' kernels are labelled anonymously, as everywhere else.

The counters are the accounting's (docs/admins/accounting.md): what the server's user (through a
broker's admin, every user) reserved and used since accounting began, per ``owner``. They are named
in the base units Prometheus asks for and the gauges use — ``…_byte_seconds_total`` rather than
GiB·hours (divide by 2^30 × 3600 for GiB·hours, as ``jupyter gpushare report`` prints them).

The series are declared once, as :data:`METRICS` and :data:`COUNTERS`: the collector builds its
families from them, and the documentation's metrics reference is generated from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from jupyter_gpushare.core.errors import GPUShareError
from jupyter_gpushare.core.payloads import StatusPayload, UsageRowPayload
from jupyter_gpushare.core.sizes import GiB


@dataclass(frozen=True)
class MetricDefinition:
    """One gauge: its name, its help text and its labels (in the order values are given)."""

    name: str
    documentation: str
    labels: tuple[str, ...]

    metric_type = "gauge"  # Prometheus' TYPE line

    def family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=list(self.labels))


@dataclass(frozen=True)
class CounterDefinition:
    """One counter of the accounting: its name (with ``_total``), help text, and the field of
    a usage row it counts, times ``scale`` (to base units)."""

    name: str
    documentation: str
    field: str
    scale: float = 1.0
    labels: tuple[str, ...] = ("owner",)
    metric_type = "counter"

    def family(self) -> CounterMetricFamily:
        return CounterMetricFamily(
            self.name.removesuffix("_total"), self.documentation, labels=list(self.labels)
        )

    def value(self, row: UsageRowPayload) -> float:
        return float(row[self.field]) * self.scale  # type: ignore[literal-required]


DEVICE_LABELS = ("device", "uuid", "name")
KERNEL_LABELS = ("kernel_id", "owner", "device", "mode")

DEVICE_MEMORY_TOTAL = MetricDefinition(
    "jupyter_gpushare_device_memory_total_bytes", "GPU memory of the device", DEVICE_LABELS
)
DEVICE_MEMORY_RESERVED = MetricDefinition(
    "jupyter_gpushare_device_memory_reserved_bytes",
    "GPU memory reserved by slices on the device",
    DEVICE_LABELS,
)
DEVICE_MEMORY_USED = MetricDefinition(
    "jupyter_gpushare_device_memory_used_bytes",
    "GPU memory in use on the device (measured, or declared on a simulated pool)",
    DEVICE_LABELS,
)
KERNEL_MEMORY_REQUEST = MetricDefinition(
    "jupyter_gpushare_kernel_memory_request_bytes", "GPU memory reserved by the kernel", KERNEL_LABELS
)
KERNEL_MEMORY_USED = MetricDefinition(
    "jupyter_gpushare_kernel_memory_used_bytes", "GPU memory the kernel uses", KERNEL_LABELS
)
QUEUE_LENGTH = MetricDefinition("jupyter_gpushare_queue_length", "GPU requests waiting in the queue", ())

METRICS = (
    DEVICE_MEMORY_TOTAL,
    DEVICE_MEMORY_RESERVED,
    DEVICE_MEMORY_USED,
    KERNEL_MEMORY_REQUEST,
    KERNEL_MEMORY_USED,
    QUEUE_LENGTH,
)


GIB_SECONDS = GiB * 3600.0
HOURS = 3600.0
COUNTERS = (
    CounterDefinition(
        "jupyter_gpushare_reserved_byte_seconds_total",
        "GPU memory reserved by the owner's kernels over time (bytes x seconds)",
        "reserved_gib_hours",
        GIB_SECONDS,
    ),
    CounterDefinition(
        "jupyter_gpushare_used_byte_seconds_total",
        "GPU memory the owner's kernels used over time, from the usage samples (bytes x seconds)",
        "used_gib_hours",
        GIB_SECONDS,
    ),
    CounterDefinition(
        "jupyter_gpushare_busy_seconds_total",
        "Seconds the owner's kernels held a slice while a cell ran",
        "busy_hours",
        HOURS,
    ),
    CounterDefinition(
        "jupyter_gpushare_idle_seconds_total",
        "Seconds the owner's kernels held a slice with no cell running",
        "idle_hours",
        HOURS,
    ),
    CounterDefinition(
        "jupyter_gpushare_suspended_seconds_total",
        "Seconds the owner's kernels were suspended (GPU state in host memory)",
        "suspended_hours",
        HOURS,
    ),
    CounterDefinition(
        "jupyter_gpushare_queue_wait_seconds_total",
        "Seconds the owner's requests waited in the queue",
        "queue_wait_hours",
        HOURS,
    ),
    CounterDefinition("jupyter_gpushare_starts_total", "Slices placed for the owner's kernels", "starts"),
    CounterDefinition("jupyter_gpushare_suspends_total", "Suspensions of the owner's kernels", "suspends"),
    CounterDefinition("jupyter_gpushare_resumes_total", "Resumes of the owner's kernels", "resumes"),
)


class GPUShareCollector(Collector):
    def __init__(
        self,
        snapshot: Callable[[], StatusPayload],
        totals: Callable[[], list[UsageRowPayload]] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._totals = totals

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        data = self._snapshot()
        pool, kernels = data["pool"], data["kernels"]
        total, reserved, used_on_device = (
            DEVICE_MEMORY_TOTAL.family(),
            DEVICE_MEMORY_RESERVED.family(),
            DEVICE_MEMORY_USED.family(),
        )
        for device in pool["devices"]:
            # On Kubernetes a device is a GPU node, labelled by its name.
            labels = [device.get("node") or f"GPU{device['id']}", device["uuid"], device["name"]]
            total.add_metric(labels, device["memory_total"])
            reserved.add_metric(labels, device["memory_reserved"])
            used_on_device.add_metric(labels, device["memory_used"])
        yield from (total, reserved, used_on_device)

        request, used = KERNEL_MEMORY_REQUEST.family(), KERNEL_MEMORY_USED.family()
        # Other users' kernels have no id here: their series are summed per device and mode.
        totals: dict[tuple[str, str, str, str], list[int]] = {}
        for kernel in kernels:
            if kernel["state"] != "running":
                continue
            where = kernel.get("node") or f"GPU{kernel['device']}"
            key = (kernel["kernel_id"] or "", kernel["owner"], where, kernel["mode"] or "")
            sums = totals.setdefault(key, [0, 0])
            sums[0] += kernel["memory_request"] or 0
            sums[1] += kernel["memory_used"] or 0
        for key, (requested, in_use) in totals.items():
            request.add_metric(list(key), requested)
            used.add_metric(list(key), in_use)
        yield request
        yield used
        queue = QUEUE_LENGTH.family()
        queue.add_metric([], len(pool["queue"]))
        yield queue
        yield from self._counters()

    def _counters(self) -> Iterator[CounterMetricFamily]:
        try:
            rows = self._totals() if self._totals is not None else []
        except GPUShareError:
            rows = []  # no accounting here, or the pool cannot be read now: no counters
        for definition in COUNTERS:
            family = definition.family()
            for row in rows:
                family.add_metric([row["key"]], definition.value(row))
            yield family


_registered: GPUShareCollector | None = None


def register(
    snapshot: Callable[[], StatusPayload], totals: Callable[[], list[UsageRowPayload]] | None = None
) -> GPUShareCollector:
    """Register (or replace, for a second server in one process) the collector."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = GPUShareCollector(snapshot, totals)
    REGISTRY.register(_registered)
    return _registered
