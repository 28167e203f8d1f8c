"""What a broker and its clients send each other, as JSON: records, outcomes, devices, a server's
kernels. Pure.

The broker (:mod:`jupyter_gpushare.broker`) answers with these shapes and the client
(:class:`~.backend.RemoteBackend`) reads them back into the very values a backend in the caller's
own process would have returned, so the code above never sees a difference. A refusal is no
record: :mod:`.transport` alone turns one into a domain error and back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jupyter_gpushare.backends.protocol import ServerKernels
from jupyter_gpushare.core.devices import Device, MigInstance
from jupyter_gpushare.core.records import (
    STORED_PLACEMENT,
    Holding,
    Outcome,
    Placed,
    ProcessIdentity,
    Refused,
    SliceRecord,
    UsageReport,
    Waiting,
)

# ---- records and outcomes -----------------------------------------------------------------------


def record_to_json(record: SliceRecord) -> dict[str, Any]:
    data = dataclasses.asdict(record)
    data["warnings"] = list(record.warnings)
    # The wire keeps the field's first name, as the ledger does: a broker and its servers may
    # be upgraded one after the other.
    data[STORED_PLACEMENT] = data.pop("placement")
    return data


def record_from_json(data: dict[str, Any]) -> SliceRecord:
    fields = dict(data)
    fields["holder"] = ProcessIdentity(**fields["holder"])
    fields["kernel"] = ProcessIdentity(**fields["kernel"]) if fields.get("kernel") else None
    fields["warnings"] = tuple(fields.get("warnings") or ())
    fields["placement"] = fields.pop(STORED_PLACEMENT)
    return SliceRecord(**fields)


def holding_to_json(held: Holding) -> dict[str, Any]:
    return {"memory": held.memory, "source": held.source, "gpu_pids": list(held.gpu_pids)}


def holding_from_json(data: dict[str, Any]) -> Holding:
    return Holding(int(data["memory"]), data.get("source"), tuple(data.get("gpu_pids") or ()))


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Placed):
        return {"state": "placed", "record": record_to_json(outcome.record)}
    if isinstance(outcome, Waiting):
        return {"state": "waiting", "position": outcome.position, "reason": outcome.reason}
    return {"state": "refused", "reason": outcome.reason, "timed_out": outcome.timed_out}


def outcome_from_json(data: dict[str, Any]) -> Outcome:
    state = data.get("state")
    if state == "placed":
        return Placed(record_from_json(data["record"]))
    if state == "waiting":
        return Waiting(int(data["position"]), str(data["reason"]))
    return Refused(str(data.get("reason") or "refused"), bool(data.get("timed_out")))


# ---- devices, usage, a server's kernels ---------------------------------------------------------


def device_to_json(device: Device) -> dict[str, Any]:
    return dataclasses.asdict(device)


def device_from_json(data: dict[str, Any]) -> Device:
    fields = dict(data)
    fields["mig"] = tuple(MigInstance(**instance) for instance in fields.get("mig") or ())
    return Device(**fields)


def usage_to_json(report: UsageReport) -> dict[str, Any]:
    return dataclasses.asdict(report)


def server_kernels_to_json(server: ServerKernels) -> dict[str, Any]:
    return {
        "ids": sorted(server.ids),
        "gpushare": sorted(server.gpushare),
        "starting": sorted(server.starting),
        "ended": sorted(server.ended),
        "names": {kernel_id: list(pair) for kernel_id, pair in server.names.items()},
        "details": dict(server.details),
        "warnings": {kernel_id: list(found) for kernel_id, found in server.warnings.items()},
    }


def server_kernels_from_json(data: Any) -> ServerKernels:
    """A server's kernels as it described them; raises ValueError on anything malformed."""
    if not isinstance(data, dict):
        raise ValueError("the server's kernels must be a JSON object")

    def ids(name: str) -> frozenset[str]:
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"{name} must be a list of kernel ids")
        return frozenset(value)

    def strings(name: str, shape: str) -> dict[str, Any]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be an object of {shape}")
        return value

    names = strings("names", "[kernelspec, path] pairs")
    details = strings("details", "strings")
    warnings = strings("warnings", "lists of strings")
    for pair in names.values():
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise ValueError("names must map kernel ids to [kernelspec, path] pairs")
    if not all(isinstance(text, str) for text in details.values()):
        raise ValueError("details must map kernel ids to strings")
    for found in warnings.values():
        if not (isinstance(found, list) and all(isinstance(text, str) for text in found)):
            raise ValueError("warnings must map kernel ids to lists of strings")
    return ServerKernels(
        ids=ids("ids"),
        gpushare=ids("gpushare"),
        starting=ids("starting"),
        ended=ids("ended"),
        names={kernel_id: (pair[0], pair[1]) for kernel_id, pair in names.items()},
        details=dict(details),
        warnings={kernel_id: tuple(found) for kernel_id, found in warnings.items()},
    )


__all__ = [
    "device_from_json",
    "device_to_json",
    "holding_from_json",
    "holding_to_json",
    "outcome_from_json",
    "outcome_to_json",
    "record_from_json",
    "record_to_json",
    "server_kernels_from_json",
    "server_kernels_to_json",
    "usage_to_json",
]
