"""``GET pool`` and ``GET kernels`` of the local backend, read from the node ledger.

Split from :mod:`.local` so that the backend keeps to placement and changes; these functions only
read the ledger and hand its rows to the pure views (:mod:`jupyter_gpushare.views`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..devices import Device
from ..payloads import KernelPayload, PoolPayload
from ..records import ReleasedSlice, SliceRecord
from ..views import kernel_view, kernels_view, pool_view, queue_positions, released_view, slice_less_view
from .base import ServerKernels

if TYPE_CHECKING:
    from ..config import GPUShare
    from ..devices import Inventory
    from ..ledger import Ledger
    from ..modes import NodeFacts

# The records with the queued ones in the order they are served (the queue policy's order).
InLine = Callable[[list[SliceRecord]], list[SliceRecord]]


def as_recorded(records: list[SliceRecord]) -> list[SliceRecord]:
    return records


def with_sampled_usage(recorded: Sequence[Device], discovered: Sequence[Device]) -> list[Device]:
    """The pool's devices with their latest sampled usage.

    The ledger holds what the monitors last measured; a device never sampled shows what this
    process's own inventory read, and a process that sees no GPU (a CLI on a login shell) shows
    the devices the node's servers registered.
    """
    if not recorded:
        return list(discovered)
    read = {device.uuid: device for device in discovered}
    return [
        dataclasses.replace(
            device, memory_used=read[device.uuid].memory_used, utilization=read[device.uuid].utilization
        )
        if device.memory_used is None and device.uuid in read
        else device
        for device in recorded
    ]


def unit_memory(devices: Sequence[Device], unit_uuid: str | None) -> int:
    """The memory of the card or MIG instance ``unit_uuid`` of the pool."""
    for device in devices:
        if device.uuid == unit_uuid:
            return device.memory_total
        for instance in device.mig:
            if instance.uuid == unit_uuid:
                return instance.memory_total
    raise LookupError(f"device {unit_uuid} is not in the pool")


def counted(released: Sequence[ReleasedSlice]) -> list[ReleasedSlice]:
    """Released kernels the pool still counts: suspended, or holding memory."""
    return [left for left in released if left.suspended is not None or left.held > 0]


def pool(
    ledger: Ledger,
    devices: Sequence[Device],
    inventory: Inventory,
    facts: NodeFacts,
    settings: GPUShare,
    viewer: str,
    problem: str | None,
    in_line: InLine = as_recorded,
) -> PoolPayload:
    return pool_view(
        devices,
        in_line(ledger.records()),
        facts,
        backend="local",
        simulated=inventory.simulated or (not inventory.devices and ledger.simulated()),
        overcommit=settings.overcommit,
        viewer=viewer,
        problem=problem,
        released=counted(ledger.released_all()),
    )


def all_kernels(
    ledger: Ledger, devices: Sequence[Device], viewer: str, in_line: InLine = as_recorded
) -> list[KernelPayload]:
    """Every slice, and every kernel suspended or holding memory without one."""
    views = kernels_view(in_line(ledger.records()), devices, viewer=viewer)
    views += [released_view(left, devices, viewer) for left in counted(ledger.released_all())]
    return views


def server_kernels(
    ledger: Ledger,
    devices: Sequence[Device],
    server: ServerKernels,
    server_id: str,
    owner: str,
    viewer: str,
    records: list[SliceRecord] | None = None,
) -> list[KernelPayload]:
    """This server's slices (queued and running), and its gpushare kernels without one:
    suspended, released (with what they still hold), or a start not in the ledger yet; shown
    as ``viewer`` may see them (a broker's caller). ``records``: the ledger's, the queued ones in
    the order they are served (default: as recorded)."""
    records = ledger.records() if records is None else records
    positions = queue_positions(records)
    views = [
        kernel_view(record, devices, positions.get(record.kernel_id), viewer)
        for record in records
        if record.kernel_id in server.ids or record.server_id == server_id
    ]
    listed = {view["kernel_id"] for view in views}
    released = {left.kernel_id: left for left in ledger.released_all()} if server.gpushare - listed else {}
    for kernel_id in sorted(server.gpushare - listed):
        kernel_name, path = server.name_of(kernel_id)
        starting = kernel_id in server.starting
        left = released.get(kernel_id)
        if left is not None and not starting:
            view = released_view(left, devices, viewer)
            view["kernel_name"] = view["kernel_name"] or kernel_name
            view["path"] = view["path"] or path
            views.append(view)
            continue
        views.append(
            slice_less_view(
                kernel_id,
                kernel_name=kernel_name,
                path=path,
                owner=owner,
                state="queued" if starting else "released",
                detail=server.details.get(kernel_id) if starting else None,
            )
        )
    for view in views:
        own = view["kernel_id"]
        if own is None:
            continue
        if view["state"] == "queued" and own in server.details:
            view["detail"] = server.details[own]
        if own in server.warnings:
            view["warnings"] = [*view["warnings"], *server.warnings[own]]
    return views
