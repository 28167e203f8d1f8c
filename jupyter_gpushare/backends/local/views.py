"""``GET pool`` and ``GET kernels`` of the local backend, from one read of the node ledger.

These functions take what the ledger held at one moment (``Ledger.state``) and hand its rows to
the pure views (:mod:`jupyter_gpushare.core.views`); the backend (:mod:`.backend`) keeps to
placement and changes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

from jupyter_gpushare.backends.local.accounts import show_idle
from jupyter_gpushare.backends.protocol import ServerKernels
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload
from jupyter_gpushare.core.records import LedgerState, ReleasedSlice, SliceRecord
from jupyter_gpushare.core.views import (
    device_indexes,
    kernel_view,
    kernels_view,
    pool_view,
    queue_positions,
    released_view,
    slice_less_view,
)

if TYPE_CHECKING:
    from jupyter_gpushare.backends.accounting import Activity
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.core.devices import Inventory
    from jupyter_gpushare.core.modes import NodeFacts

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


def problem(registered: Sequence[Device], inventory: Inventory) -> str | None:
    """Why the pool is empty (None when the node's servers registered devices)."""
    return None if registered else (inventory.problem or "no GPU found")


def pool(
    state: LedgerState,
    inventory: Inventory,
    facts: NodeFacts,
    settings: GPUShare,
    viewer: str,
    in_line: InLine = as_recorded,
    write_fault: str | None = None,
) -> PoolPayload:
    """The pool; its ``problem``: why it is empty, else why no change can be written now."""
    return pool_view(
        with_sampled_usage(state.devices, inventory.devices),
        in_line(list(state.slices)),
        facts,
        backend="local",
        simulated=inventory.simulated or (not inventory.devices and state.simulated),
        overcommit=settings.overcommit,
        viewer=viewer,
        problem=problem(state.devices, inventory) or write_fault,
        released=counted(state.released),
    )


def all_kernels(
    state: LedgerState, inventory: Inventory, viewer: str, in_line: InLine = as_recorded
) -> list[KernelPayload]:
    """Every slice, and every kernel suspended or holding memory without one."""
    devices = with_sampled_usage(state.devices, inventory.devices)
    views = kernels_view(in_line(list(state.slices)), devices, viewer=viewer)
    views += [released_view(left, devices, viewer) for left in counted(state.released)]
    return views


class KernelViews:
    """The views of the records last shown, kept for the next call.

    The ledger's state keeps the same record object for a row that did not change, so a record
    shown at the same place, to the same viewer, with the same report of its cells, keeps its
    view: the same dict, which the server then renders once too
    (:mod:`jupyter_gpushare.server.snapshots`). After a change of one slice one view is made
    again, not a hundred. A view handed out is never changed afterwards.
    """

    def __init__(self) -> None:
        # (viewer, device indexes) and the views by record, swapped as one (threads share it).
        self._kept: tuple[Hashable, dict[int, tuple[SliceRecord, Hashable, KernelPayload]]] = (None, {})

    def of(
        self,
        records: Sequence[SliceRecord],
        devices: Sequence[Device],
        positions: Mapping[str, int],
        viewer: str,
        activity: Mapping[str, Activity] | None = None,
    ) -> list[KernelPayload]:
        index_of = device_indexes(devices)
        context = (viewer, tuple(index_of.items()), activity is None)
        kept_for, known = self._kept
        if kept_for != context:
            known = {}
        views: list[KernelPayload] = []
        kept: dict[int, tuple[SliceRecord, Hashable, KernelPayload]] = {}
        for record in records:
            reported = activity.get(record.kernel_id) if activity is not None else None
            key = (positions.get(record.kernel_id), reported)
            hit = known.get(id(record))
            if hit is not None and hit[0] is record and hit[1] == key:
                view = hit[2]
            else:
                view = kernel_view(record, devices, key[0], viewer, index_of)
                if activity is not None and view["state"] == "running":
                    show_idle(view, reported)
            kept[id(record)] = (record, key, view)
            views.append(view)
        self._kept = (context, kept)
        return views


def server_kernels(
    state: LedgerState,
    inventory: Inventory,
    server: ServerKernels,
    server_id: str,
    owner: str,
    viewer: str,
    records: Sequence[SliceRecord] | None = None,
    kept: KernelViews | None = None,
    activity: Mapping[str, Activity] | None = None,
) -> list[KernelPayload]:
    """This server's slices (queued and running), and its gpushare kernels without one:
    suspended, released (with what they still hold), or a start not in the ledger yet; shown
    as ``viewer`` may see them (a broker's caller). ``records``: the ledger's, the queued ones in
    the order they are served (default: as recorded); ``kept``: the views of the last call;
    ``activity``: the kernels' own reports of their cells (running kernels show since when they
    are idle and what their idle timer will do)."""
    devices = with_sampled_usage(state.devices, inventory.devices)
    records = state.slices if records is None else records
    positions = queue_positions(records)
    shown = [record for record in records if record.kernel_id in server.ids or record.server_id == server_id]
    views = (kept or KernelViews()).of(shown, devices, positions, viewer, activity)
    listed = {view["kernel_id"] for view in views}
    released = {left.kernel_id: left for left in state.released}
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
    for index, view in enumerate(views):
        own = view["kernel_id"]
        if own is None:
            continue
        detail = server.details.get(own) if view["state"] == "queued" else None
        if detail is not None or own in server.warnings:
            view = views[index] = copy.copy(view)  # a kept view stays as it was
        if detail is not None:
            view["detail"] = detail
        if own in server.warnings:
            view["warnings"] = [*view["warnings"], *server.warnings[own]]
    return views
