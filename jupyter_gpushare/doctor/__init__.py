"""``jupyter gpushare doctor``: is this node (or cluster) ready to share GPUs, and if not, what
to do. Each check is one line — OK, WARN or FAIL — with the fix; the checks are the ones that
matter where the user is:

* **through a broker** (``broker_url``): the broker, the pool it serves, the kernelspecs — the
  ledger, the node's GPUs and the cluster are the broker's business;
* **on a node** (the local backend): its GPUs (or the pool its ledger remembers), the sharing
  modes it offers, the ledger, the kernelspecs;
* **on a cluster** (the Kubernetes backend): access, RBAC, the GPU resources or DRA devices.

The checks of a node and of a cluster are their kinds' (``doctor_checks`` in the registry:
:mod:`jupyter_gpushare.backends.local.doctor`, :mod:`jupyter_gpushare.backends.kubernetes.doctor`);
the doctor runs the configured kind's and the ones every kind shares (:mod:`.common`).

The last check starts a real gpushare kernel, as any other start would, and asks what it sees.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

from jupyter_gpushare.backends.registry import kind_for, load
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.devices import Inventory
from jupyter_gpushare.core.findings import Check, Findings, Status, check_gpus
from jupyter_gpushare.doctor.common import (
    check_broker,
    check_kernelspecs,
    check_settings,
    seen_through_the_broker,
)
from jupyter_gpushare.doctor.kernel import check_test_kernel


def _none(settings: GPUShare, inventory: Inventory | None) -> Findings:
    return Findings([], ready=True, simulated=False)


def run_checks(settings: GPUShare, *, kernel: bool = True, inventory: Inventory | None = None) -> list[Check]:
    if settings.effective_broker_url():
        broker, served = check_broker(settings)
        pool = seen_through_the_broker(served)
        checks = [broker, *([check_gpus(pool)] if served is not None else []), check_kernelspecs()]
        ready, simulated = served is not None and bool(pool.devices), pool.simulated
    else:
        # The kind's own checks; a kind that names none has only the ones every kind shares.
        reference = kind_for(settings).doctor_checks
        find: Callable[[GPUShare, Inventory | None], Findings] = load(reference) if reference else _none
        findings = find(settings, inventory)
        checks, ready, simulated = [*findings.checks, check_kernelspecs()], findings.ready, findings.simulated
    if kernel:
        checks.append(check_test_kernel(ready, simulated, printed=checks))
    return [check_settings(settings), *checks]


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


__all__ = ["Check", "Status", "check_test_kernel", "report", "run_checks"]
