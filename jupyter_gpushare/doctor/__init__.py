"""``jupyter gpushare doctor``: is this node (or cluster) ready to share GPUs, and if not, what
to do. Each check is one line — OK, WARN or FAIL — with the fix; the checks are the ones that
matter where the user is:

* **through a broker** (``broker_url``): the broker, the pool it serves, the kernelspecs — the
  ledger, the node's GPUs and the cluster are the broker's business;
* **on a node** (the local backend): its GPUs (or the pool its ledger remembers), the sharing
  modes it offers, the ledger, the kernelspecs;
* **on a cluster** (the Kubernetes backend): access, RBAC, the GPU resources or DRA devices.

The last check starts a real gpushare kernel, as any other start would, and asks what it sees.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ..config import GPUShare
from ..inventory import Inventory, discover
from .checks import Check, Status
from .cluster import check_cluster, check_dra
from .kernel import check_test_kernel
from .node import (
    check_broker,
    check_gpus,
    check_kernelspecs,
    check_ledger,
    check_mig,
    check_modes,
    check_mps,
    check_vgpu,
    node_facts,
    relevant_mode_checks,
    seen_locally,
    seen_through_the_broker,
)


def run_checks(settings: GPUShare, *, kernel: bool = True, inventory: Inventory | None = None) -> list[Check]:
    if settings.effective_broker_url():
        broker, served = check_broker(settings)
        pool = seen_through_the_broker(served)
        checks = [broker, *([check_gpus(pool)] if served is not None else []), check_kernelspecs()]
        ready, simulated = served is not None and bool(pool.devices), pool.simulated
    elif settings.backend == "kubernetes":
        checks = [*check_cluster(settings), check_kernelspecs()]
        ready = all(check.status != "FAIL" for check in checks if check.name == "cluster")
        simulated = False
    else:
        inventory = inventory if inventory is not None else discover(settings.effective_simulate())
        pool = seen_locally(settings, inventory)
        facts = node_facts(settings, inventory, pool)
        checks = [
            check_gpus(pool, inventory.details.get("driver", "?")),
            *([check_modes(settings, facts)] if pool.devices else []),
            *relevant_mode_checks(settings, inventory, facts),
            check_ledger(settings),
            check_kernelspecs(),
        ]
        ready, simulated = bool(pool.devices), pool.simulated
    if kernel:
        checks.append(check_test_kernel(ready, simulated))
    return checks


def report(checks: list[Check], as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {"ok": all(c.status != "FAIL" for c in checks), "checks": [asdict(c) for c in checks]}, indent=2
        )
    failed = sum(check.status == "FAIL" for check in checks)
    warned = sum(check.status == "WARN" for check in checks)
    lines = [check.line() for check in checks]
    lines.append(f"{len(checks)} checks: {failed} FAIL, {warned} WARN")
    return "\n".join(lines)


__all__ = [
    "Check",
    "Status",
    "check_cluster",
    "check_dra",
    "check_gpus",
    "check_ledger",
    "check_mig",
    "check_mps",
    "check_test_kernel",
    "check_vgpu",
    "report",
    "run_checks",
]
