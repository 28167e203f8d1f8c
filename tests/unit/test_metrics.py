"""The collector emits exactly the series declared in ``METRICS`` (which the docs list)."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.server.metrics import METRICS, GPUShareCollector


def snapshot() -> dict[str, Any]:
    device = {"id": 0, "uuid": "GPU-sim-0", "name": "A100", "memory_total": 80, "memory_reserved": 4}
    device["memory_used"] = 1
    kernel = {"state": "running", "kernel_id": "k1", "owner": "alice", "device": 0, "mode": "timeslice"}
    kernel.update(memory_request=4, memory_used=1)
    return {"pool": {"devices": [device], "queue": []}, "kernels": [kernel]}


def test_the_collector_emits_the_declared_metrics_with_their_labels() -> None:
    families = list(GPUShareCollector(snapshot).collect())
    assert [family.name for family in families] == [definition.name for definition in METRICS]
    for family, definition in zip(families, METRICS, strict=True):
        assert family.documentation == definition.documentation
        assert family.samples, family.name
        assert tuple(family.samples[0].labels) == definition.labels
