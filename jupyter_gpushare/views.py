"""The JSON shapes of SPEC §7 (``GET pool``, ``GET kernels``), built from ledger rows. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .inventory import Device
from .modes import MODES, NodeFacts
from .records import SliceRecord
from .sizes import parse_size

ANONYMOUS = "another user"


def pool_view(
    devices: Sequence[Device],
    records: Sequence[SliceRecord],
    facts: NodeFacts,
    *,
    backend: str,
    simulated: bool,
    overcommit: float,
    viewer: str,
) -> dict[str, Any]:
    """``GET pool``: devices with reserved/used memory and the queue, others anonymised."""
    running = [record for record in records if record.state == "running"]
    queued = [record for record in records if record.state == "queued"]
    return {
        "backend": backend,
        "simulated": simulated,
        "overcommit": overcommit,
        "devices": [_device_view(device, running, facts, viewer) for device in devices],
        "queue": [
            {
                "position": position,
                "kernel_id": record.kernel_id if record.owner == viewer else None,
                "owner": record.owner if record.owner == viewer else ANONYMOUS,
                "memory_request": requested_bytes(record),
                "size": record.size,
                "mode": record.mode,
                "requested_at": record.requested_at,
            }
            for position, record in enumerate(queued, start=1)
        ],
    }


def _device_view(
    device: Device, running: Sequence[SliceRecord], facts: NodeFacts, viewer: str
) -> dict[str, Any]:
    on_device = [record for record in running if record.device_uuid == device.uuid]
    by_unit = {record.unit_uuid: record for record in on_device}
    if device.mig_enabled:
        modes = ["mig"]
    else:
        modes = [
            name
            for name, mode in MODES.items()
            if mode.placement != "mig" and mode.unavailable_reason(facts) is None
        ]
    return {
        "id": device.index,
        "uuid": device.uuid,
        "name": device.name,
        "memory_total": device.memory_total,
        "memory_reserved": sum(record.memory for record in on_device),
        "memory_used": device.memory_used or 0,
        "utilization": device.utilization,
        "modes": modes,
        "mig": [
            {
                "uuid": instance.uuid,
                "profile": instance.profile,
                "memory_total": instance.memory_total,
                "kernel_id": _visible_kernel_id(by_unit.get(instance.uuid), viewer),
                "in_use": instance.uuid in by_unit,
            }
            for instance in device.mig
        ],
    }


def requested_bytes(record: SliceRecord) -> int | None:
    """Bytes held by a running slice, or asked for by a queued one (None for 25% or whole,
    which only mean bytes once a device is chosen)."""
    if record.state == "running":
        return record.memory
    size = parse_size(record.size)
    return size.resolve(0) if size.kind == "bytes" else None


def _visible_kernel_id(record: SliceRecord | None, viewer: str) -> str | None:
    if record is None or record.owner != viewer:
        return None
    return record.kernel_id


def kernel_view(
    record: SliceRecord, devices: Sequence[Device], queue_position: int | None, viewer: str
) -> dict[str, Any]:
    """One entry of ``GET kernels``; a slice of another user is occupancy with no details."""
    index_of = {device.uuid: device.index for device in devices}
    mine = record.owner == viewer
    return {
        "kernel_id": record.kernel_id if mine else None,
        "kernel_name": record.kernel_name if mine else "",
        "path": record.path if mine else "",
        "owner": record.owner if mine else ANONYMOUS,
        "state": record.state,
        "queue_position": queue_position,
        "device": index_of.get(record.device_uuid) if record.device_uuid else None,
        "mode": record.mode,
        "memory_request": requested_bytes(record),
        "size": record.size,
        "memory_used": record.memory_used or 0,
        "utilization": record.utilization,
        # "nvml" (measured), "kernel" (the kernel's own report) or "simulated" (declared).
        "usage_source": record.usage_source,
        "warnings": list(record.warnings) if mine else [],
    }


def kernels_view(
    records: Sequence[SliceRecord], devices: Sequence[Device], viewer: str
) -> list[dict[str, Any]]:
    positions = {
        record.kernel_id: position
        for position, record in enumerate((record for record in records if record.state == "queued"), start=1)
    }
    return [kernel_view(record, devices, positions.get(record.kernel_id), viewer) for record in records]
