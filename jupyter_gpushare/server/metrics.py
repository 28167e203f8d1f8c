"""Prometheus gauges ``jupyter_gpushare_*`` on the server's own ``/metrics``.

A collector reads the pool and kernels when Prometheus scrapes, so the series are never stale
and a finished kernel's series disappears with it. Labels carry device and owner so a Grafana
board can group by either; other users' kernels are labelled anonymously, as everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from ..payloads import StatusPayload


class GPUShareCollector(Collector):
    def __init__(self, snapshot: Callable[[], StatusPayload]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        data = self._snapshot()
        pool, kernels = data["pool"], data["kernels"]
        device_labels = ["device", "uuid", "name"]
        families = {
            "total": GaugeMetricFamily(
                "jupyter_gpushare_device_memory_total_bytes", "GPU memory of the device", labels=device_labels
            ),
            "reserved": GaugeMetricFamily(
                "jupyter_gpushare_device_memory_reserved_bytes",
                "GPU memory reserved by slices on the device",
                labels=device_labels,
            ),
            "used": GaugeMetricFamily(
                "jupyter_gpushare_device_memory_used_bytes",
                "GPU memory in use on the device (measured, or declared on a simulated pool)",
                labels=device_labels,
            ),
        }
        for device in pool["devices"]:
            # On Kubernetes a device is a GPU node, labelled by its name.
            labels = [device.get("node") or f"GPU{device['id']}", device["uuid"], device["name"]]
            families["total"].add_metric(labels, device["memory_total"])
            families["reserved"].add_metric(labels, device["memory_reserved"])
            families["used"].add_metric(labels, device["memory_used"])
        yield from families.values()

        kernel_labels = ["kernel_id", "owner", "device", "mode"]
        request = GaugeMetricFamily(
            "jupyter_gpushare_kernel_memory_request_bytes",
            "GPU memory reserved by the kernel",
            labels=kernel_labels,
        )
        used = GaugeMetricFamily(
            "jupyter_gpushare_kernel_memory_used_bytes", "GPU memory the kernel uses", labels=kernel_labels
        )
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
        queue = GaugeMetricFamily("jupyter_gpushare_queue_length", "GPU requests waiting in the queue")
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
