"""The collector emits exactly the series declared in ``METRICS`` and ``COUNTERS`` (which the docs
list), the counters in base units from the accounting's totals."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.core.accounting.tally import Figures
from jupyter_gpushare.core.accounting.usage_report import row
from jupyter_gpushare.core.errors import NoAccountingError
from jupyter_gpushare.server.metrics import COUNTERS, METRICS, GPUShareCollector

GiB = 2**30


def snapshot() -> dict[str, Any]:
    device = {"id": 0, "uuid": "GPU-sim-0", "name": "A100", "memory_total": 80, "memory_reserved": 4}
    device["memory_used"] = 1
    kernel = {"state": "running", "kernel_id": "k1", "owner": "alice", "device": 0, "mode": "timeslice"}
    kernel.update(memory_request=4, memory_used=1)
    return {"pool": {"devices": [device], "queue": []}, "kernels": [kernel]}


ALICE = Figures(reserved=2 * GiB * 3600, used=GiB * 1800, busy=60, idle=30, starts=3, suspends=1)


def totals() -> list[Any]:
    return [row("alice", "alice", ALICE, 2)]


def test_the_collector_emits_the_declared_metrics_with_their_labels() -> None:
    families = list(GPUShareCollector(snapshot, totals).collect())
    declared = [*METRICS, *COUNTERS]
    assert [family.name for family in families] == [d.name.removesuffix("_total") for d in declared]
    for family, definition in zip(families, declared, strict=True):
        assert family.type == definition.metric_type
        assert family.documentation == definition.documentation
        assert family.samples, family.name
        assert tuple(family.samples[0].labels) == definition.labels


def test_the_counters_are_the_totals_in_bytes_and_seconds() -> None:
    samples = {
        sample.name: sample.value
        for family in GPUShareCollector(snapshot, totals).collect()
        for sample in family.samples
        if family.type == "counter" and sample.name.endswith("_total")
    }
    assert samples["jupyter_gpushare_reserved_byte_seconds_total"] == 2 * GiB * 3600
    assert samples["jupyter_gpushare_used_byte_seconds_total"] == GiB * 1800
    assert samples["jupyter_gpushare_busy_seconds_total"] == 60
    assert samples["jupyter_gpushare_starts_total"] == 3


def test_a_backend_without_accounting_has_counters_without_series() -> None:
    def none() -> list[Any]:
        raise NoAccountingError("no accounting here")

    counters = [f for f in GPUShareCollector(snapshot, none).collect() if f.type == "counter"]
    assert len(counters) == len(COUNTERS) and not any(f.samples for f in counters)
