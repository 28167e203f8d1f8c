"""The measured and reported usage the ledger keeps per slice and per device (the sampler's
rounds and the kernels' own reports), written in the caller's transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from jupyter_gpushare.core.records import DeviceSample, KernelSample


def write_samples(
    db: sqlite3.Connection,
    kernel_samples: Sequence[KernelSample],
    device_samples: Sequence[DeviceSample],
    now: float,
) -> None:
    # Rows are written only where a figure changed: a round that changes nothing leaves the
    # database as it was, so readers' caches (keyed on the change marker) stay valid and
    # the REST API does not re-render every slice once per sampling round.
    db.executemany(
        """UPDATE slices SET memory_used = ?, utilization = ?, usage_source = ?,
           usage_at = ?, warnings = ?
           WHERE kernel_id = ? AND (memory_used IS NOT ? OR utilization IS NOT ?
                                    OR usage_source IS NOT ? OR warnings IS NOT ?)""",
        [
            (
                sample.memory_used,
                sample.utilization,
                sample.source,
                now,
                warnings,
                sample.kernel_id,
                sample.memory_used,
                sample.utilization,
                sample.source,
                warnings,
            )
            for sample in kernel_samples
            if sample.source is not None
            for warnings in [json.dumps(list(sample.warnings))]
        ],
    )
    db.executemany(
        "UPDATE slices SET warnings = ? WHERE kernel_id = ? AND warnings IS NOT ?",
        [
            (warnings, sample.kernel_id, warnings)
            for sample in kernel_samples
            if sample.source is None
            for warnings in [json.dumps(list(sample.warnings))]
        ],
    )
    db.executemany(
        """UPDATE devices SET memory_used = ?, utilization = ?, sampled_at = ?
           WHERE uuid = ? AND (memory_used IS NOT ? OR utilization IS NOT ?)""",
        [
            (
                sample.memory_used,
                sample.utilization,
                now,
                sample.uuid,
                sample.memory_used,
                sample.utilization,
            )
            for sample in device_samples
        ],
    )


def write_report(
    db: sqlite3.Connection, kernel_id: str, memory_used: int, utilization: int | None, source: str, now: float
) -> None:
    db.execute(
        """UPDATE slices SET memory_used = ?, utilization = ?, usage_source = ?, usage_at = ?
           WHERE kernel_id = ?""",
        (memory_used, utilization, source, now, kernel_id),
    )


__all__ = ["write_report", "write_samples"]
