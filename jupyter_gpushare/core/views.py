"""The JSON shapes of docs/reference/rest-api.md (``GET pool``, ``GET kernels``) built from ledger
rows. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.modes import MODES, NodeFacts
from jupyter_gpushare.core.payloads import DevicePayload, KernelPayload, PoolPayload, QueuePayload, State
from jupyter_gpushare.core.records import ReleasedSlice, SliceRecord
from jupyter_gpushare.core.sizes import format_bytes, parse_size
from jupyter_gpushare.core.visibility import kernel_as_seen, queue_entry_as_seen, visible_kernel_id


def pool_view(
    devices: Sequence[Device],
    records: Sequence[SliceRecord],
    facts: NodeFacts,
    *,
    backend: str,
    simulated: bool,
    overcommit: float,
    viewer: str,
    problem: str | None = None,
    released: Sequence[ReleasedSlice] = (),
) -> PoolPayload:
    """``GET pool``: devices with reserved/used memory and the queue, others anonymised.

    ``memory_reserved`` is what placement counts: each slice (or what its processes hold, when
    more) and what ``released`` kernels' processes still hold.
    """
    running = [record for record in records if record.state == "running"]
    queued = [record for record in records if record.state == "queued"]
    queue: list[QueuePayload] = [
        queue_entry_as_seen(
            {
                "position": position,
                "kernel_id": record.kernel_id,
                "owner": record.owner,
                "memory_request": requested_bytes(record),
                "size": record.size,
                "mode": record.mode,
                "requested_at": record.requested_at,
            },
            viewer,
        )
        for position, record in enumerate(queued, start=1)
    ]
    view: PoolPayload = {
        "backend": backend,
        "simulated": simulated,
        "overcommit": overcommit,
        "devices": [_device_view(device, running, released, facts, viewer) for device in devices],
        "queue": queue,
    }
    if problem:
        view["problem"] = problem
    return view


def _device_view(
    device: Device,
    running: Sequence[SliceRecord],
    released: Sequence[ReleasedSlice],
    facts: NodeFacts,
    viewer: str,
) -> DevicePayload:
    on_device = [record for record in running if record.device_uuid == device.uuid]
    by_unit = {record.unit_uuid: record for record in on_device}
    if device.mig_enabled:  # a card in MIG mode serves its instances only
        modes = [name for name, mode in MODES.items() if mode.placement == "mig"]
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
        "memory_reserved": sum(record.reserved for record in on_device)
        + sum(left.held for left in released if left.device_uuid == device.uuid),
        "memory_used": device.memory_used or 0,
        "utilization": device.utilization,
        "modes": modes,
        "mig": [
            {
                "uuid": instance.uuid,
                "profile": instance.profile,
                "memory_total": instance.memory_total,
                "kernel_id": _holder_id(by_unit.get(instance.uuid), viewer),
                "in_use": instance.uuid in by_unit,
            }
            for instance in device.mig
        ],
    }


def _holder_id(record: SliceRecord | None, viewer: str) -> str | None:
    return None if record is None else visible_kernel_id(record.kernel_id, record.owner, viewer)


def requested_bytes(record: SliceRecord) -> int | None:
    """Bytes held by a running slice, or asked for by a queued one (None for 25% or whole,
    which only mean bytes once a device is chosen)."""
    if record.state == "running":
        return record.memory
    size = parse_size(record.size)
    return size.resolve(0) if size.form == "bytes" else None


def kernel_view(
    record: SliceRecord,
    devices: Sequence[Device],
    queue_position: int | None,
    viewer: str,
    index_of: Mapping[str, int] | None = None,
) -> KernelPayload:
    """One entry of ``GET kernels``; a slice of another user is occupancy with no details.
    ``index_of``: :func:`device_indexes` of ``devices``, when the caller views many records."""
    if index_of is None:
        index_of = device_indexes(devices)
    view: KernelPayload = {
        "kernel_id": record.kernel_id,
        "kernel_name": record.kernel_name,
        "path": record.path,
        "owner": record.owner,
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
        "warnings": list(record.warnings),
        "held": record.held_beyond,
    }
    return kernel_as_seen(view, viewer)


def device_indexes(devices: Sequence[Device]) -> dict[str, int]:
    """Each device's index by UUID (a view shows the index)."""
    return {device.uuid: device.index for device in devices}


def queue_positions(records: Sequence[SliceRecord]) -> dict[str, int]:
    queued = (record for record in records if record.state == "queued")
    return {record.kernel_id: position for position, record in enumerate(queued, start=1)}


def kernels_view(
    records: Sequence[SliceRecord], devices: Sequence[Device], viewer: str
) -> list[KernelPayload]:
    positions = queue_positions(records)
    index_of = device_indexes(devices)
    return [
        kernel_view(record, devices, positions.get(record.kernel_id), viewer, index_of) for record in records
    ]


def slice_less_view(
    kernel_id: str,
    *,
    kernel_name: str,
    path: str,
    owner: str,
    state: State,
    detail: str | None = None,
) -> KernelPayload:
    """A kernel of the viewer's that holds no slice now: released, or one whose slice is still
    being prepared (``state = "queued"`` with ``detail`` saying what happens). What a released
    kernel left in the ledger (held memory, a suspended state): :func:`released_view`."""
    view: KernelPayload = {
        "kernel_id": kernel_id,
        "kernel_name": kernel_name,
        "path": path,
        "owner": owner,
        "state": state,
        "queue_position": None,
        "device": None,
        "mode": None,
        "memory_request": None,
        "size": None,
        "memory_used": 0,
        "utilization": None,
        "usage_source": None,
        "warnings": [],
        "held": 0,
    }
    if detail is not None:
        view["detail"] = detail
    return view


def released_view(left: ReleasedSlice, devices: Sequence[Device], viewer: str) -> KernelPayload:
    """A kernel running without a slice that the ledger still counts: suspended (its GPU state
    in host memory, the slice it comes back with), or released with memory its processes hold."""
    index_of = {device.uuid: device.index for device in devices}
    view = slice_less_view(
        left.kernel_id, kernel_name=left.kernel_name, path=left.path, owner=left.owner, state="released"
    )
    view["held"] = left.held
    if left.held and left.device_uuid:
        view["device"] = index_of.get(left.device_uuid)
    state = left.suspended
    if state is not None:
        view["state"] = "suspended"
        view["mode"] = state.mode
        view["size"] = state.size
        view["memory_request"] = state.memory
        view["suspended_bytes"] = state.state_bytes
        view["detail"] = (
            f"suspended: {format_bytes(state.state_bytes)} of GPU state in host memory; the next "
            f"cell (or Resume) waits for {state.size} on a {state.device_name} and restores it"
            if state.checkpointed
            else f"suspended with no GPU state to keep; the next cell (or Resume) takes {state.size}"
        )
    return kernel_as_seen(view, viewer)
