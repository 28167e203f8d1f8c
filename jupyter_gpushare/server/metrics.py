"""Prometheus gauges ``jupyter_gpushare_*`` on the server's own ``/metrics``.

A collector reads the pool and kernels when Prometheus scrapes, so the series are never stale
and a finished kernel's series disappears with it. Labels carry device and owner so a Grafana
board can group by either; other users' kernels are labelled anonymously, as everywhere else.

The series are declared once, as :data:`METRICS`: the collector builds its families from them,
and the documentation's metrics reference is generated from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from ..payloads import StatusPayload


@dataclass(frozen=True)
class MetricDefinition:
    """One gauge: its name, its help text and its labels (in the order values are given)."""

    name: str
    documentation: str
    labels: tuple[str, ...]

    def family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=list(self.labels))


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


class GPUShareCollector(Collector):
    def __init__(self, snapshot: Callable[[], StatusPayload]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
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


_registered: GPUShareCollector | None = None


def register(snapshot: Callable[[], StatusPayload]) -> GPUShareCollector:
    """Register (or replace, for a second server in one process) the collector."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = GPUShareCollector(snapshot)
    REGISTRY.register(_registered)
    return _registered
