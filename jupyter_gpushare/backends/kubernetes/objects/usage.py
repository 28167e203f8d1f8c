"""Memory use of kernel pods from a HAMi-style monitor's Prometheus metrics. Pure.

HAMi's device plugin monitor exports, per container, the memory its vGPU uses, labelled with
the pod's name and namespace. Metric and label names differ between releases, so both are
configurable; the defaults cover the names HAMi has used.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

DEFAULT_METRICS = ("hami_vgpu_memory_used_bytes", "vGPU_device_memory_usage_in_bytes")
POD_LABELS = ("podname", "pod", "pod_name")
NAMESPACE_LABELS = ("podnamespace", "namespace", "pod_namespace")


class MetricsFormatError(ValueError):
    """The text is not Prometheus exposition format."""


def pod_memory_used(
    text: str, namespace: str, metric_names: Sequence[str] = DEFAULT_METRICS
) -> dict[str, int]:
    """Bytes used per pod name in ``namespace`` (a pod's containers and vGPUs summed)."""
    wanted = set(metric_names)
    used: dict[str, int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as error:
        raise MetricsFormatError(f"not Prometheus metrics: {error}") from None
    for family in families:
        for sample in family.samples:
            if sample.name not in wanted:
                continue
            labels = sample.labels
            pod = next((labels[name] for name in POD_LABELS if labels.get(name)), None)
            pod_namespace = next((labels[name] for name in NAMESPACE_LABELS if labels.get(name)), None)
            if pod is None or (pod_namespace is not None and pod_namespace != namespace):
                continue
            used[pod] = used.get(pod, 0) + max(0, int(sample.value))
    return used
