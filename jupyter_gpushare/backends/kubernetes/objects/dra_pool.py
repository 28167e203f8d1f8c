"""The Kubernetes pool under Dynamic Resource Allocation: ResourceSlices and allocated claims. Pure.

A DRA driver publishes each node's devices in ResourceSlices (attributes such as ``type``,
``productName``, ``profile``; capacities such as ``memory``; ``allowMultipleAllocations`` where
several claims may share a device), and the scheduler writes what it gave each ResourceClaim into
``status.allocation`` (the device, and under consumable capacity how much of it). From these the
pool is shown the same way as the device-plugin node view (:mod:`.pool`): one entry per node, its
cards and MIG devices, and as reserved what every allocated claim holds there — others' claims
too, shown as anonymous occupancy.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.claims import allocated_mode
from jupyter_gpushare.backends.kubernetes.objects.manifests import KERNEL_ID_LABEL, OWNER_LABEL
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, Usage
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.core.payloads import DevicePayload, MigPayload
from jupyter_gpushare.core.pods.cluster import DraDevice, NodeGPUs
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.visibility import visible_kernel_id

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES: dict[str, int | Decimal] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}


def parse_quantity(text: object) -> int | None:
    """A Kubernetes quantity (``80Gi``, ``81920Mi``, ``85899345920``, ``1.5G``) in whole units;
    None when it is not one."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        return None
    try:
        return int(Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)]))
    except InvalidOperation:
        return None


@dataclass(frozen=True)
class ClaimUse:
    """One allocated ResourceClaim: which devices it holds, how much of each, and whose it is."""

    namespace: str
    name: str
    kernel_id: str | None  # our kernel claims carry the kernel id label
    owner: str
    mode: str | None  # the firstAvailable subrequest allocated, where there was a choice
    held: tuple[tuple[str, str, int | None], ...] = field(default_factory=tuple)  # (pool, device, bytes)


def _attribute(values: Mapping[str, Any], name: str) -> str | None:
    value = values.get(name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def read_slices(slices: Iterable[Mapping[str, Any]], names: DraNames) -> list[DraDevice]:
    """The devices the preset's driver publishes, node by node (others' drivers are not ours)."""
    devices: list[DraDevice] = []
    for resource_slice in slices:
        spec = resource_slice.get("spec") or {}
        if spec.get("driver") != names.driver or not spec.get("nodeName"):
            continue
        pool = str((spec.get("pool") or {}).get("name") or spec["nodeName"])
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            capacity = (device.get("capacity") or {}).get(names.memory_capacity) or {}
            devices.append(
                DraDevice(
                    node=str(spec["nodeName"]),
                    pool=pool,
                    name=str(device.get("name") or "?"),
                    device_type=_attribute(attributes, "type") or "gpu",
                    memory=parse_quantity(capacity.get("value")) or 0,
                    product=_attribute(attributes, names.product_attribute),
                    uuid=_attribute(attributes, "uuid"),
                    profile=_attribute(attributes, names.mig_profile_attribute),
                    shared=bool(device.get("allowMultipleAllocations")),
                )
            )
    return devices


def read_claims(claims: Iterable[Mapping[str, Any]], names: DraNames) -> list[ClaimUse]:
    """The allocated claims, with what they hold of the preset's driver's devices."""
    uses: list[ClaimUse] = []
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if not results:
            continue
        metadata = claim.get("metadata") or {}
        labels = metadata.get("labels") or {}
        held = []
        for result in results:
            if result.get("driver") != names.driver:
                continue
            consumed = (result.get("consumedCapacity") or {}).get(names.memory_capacity)
            held.append(
                (
                    str(result.get("pool") or ""),
                    str(result.get("device") or ""),
                    parse_quantity(consumed) if consumed is not None else None,
                )
            )
        uses.append(
            ClaimUse(
                namespace=str(metadata.get("namespace") or ""),
                name=str(metadata.get("name") or ""),
                kernel_id=labels.get(KERNEL_ID_LABEL),
                owner=str(labels.get(OWNER_LABEL) or ""),
                mode=allocated_mode(claim),
                held=tuple(held),
            )
        )
    return uses


def facts_from_slices(devices: Sequence[DraDevice]) -> tuple[list[str], int | None, bool]:
    """What claims depend on: the MIG profiles offered, the smallest card's memory (a share is
    resolved against it: never more than asked) and whether any device takes several claims."""
    profiles = sorted({device.profile for device in devices if device.is_mig and device.profile})
    memories = [device.memory for device in devices if not device.is_mig and device.memory]
    shared = any(device.shared for device in devices)
    return profiles, (min(memories) if memories else None), shared


def _held_bytes(use_bytes: int | None, device: DraDevice) -> int:
    """What one allocation holds of a device: its consumed capacity, else the whole device."""
    return device.memory if use_bytes is None else use_bytes


def offered_modes(devices: Sequence[DraDevice], preset: ResourcePreset) -> tuple[str, ...]:
    """The modes kernel claims may ask of these devices (one node's): each mode says whether
    they serve it."""
    names = preset.dra
    assert names is not None
    return tuple(name for name, mode in MODES.items() if mode.offered_by_devices(devices, names))


def dra_nodes(
    devices: Sequence[DraDevice], uses: Sequence[ClaimUse], preset: ResourcePreset
) -> list[NodeGPUs]:
    """One :class:`NodeGPUs` per node with devices of the driver, sorted by name."""
    by_key = {device.key: device for device in devices}
    claimed: Counter[str] = Counter()
    for use in uses:
        for pool, name, amount in use.held:
            device = by_key.get((pool, name))
            if device is not None:
                claimed[device.node] += _held_bytes(amount, device)
    nodes: list[NodeGPUs] = []
    for node in sorted({device.node for device in devices}):
        here = [device for device in devices if device.node == node]
        cards = [device for device in here if not device.is_mig]
        migs = [device for device in here if device.is_mig]
        memory_total = sum(device.memory for device in cards) or sum(device.memory for device in migs)
        products = [device.product for device in here if device.product]
        nodes.append(
            NodeGPUs(
                name=node,
                product=products[0] if products else None,
                card_memory=max((device.memory for device in cards), default=None) or None,
                cards=len(cards) or None,
                sharing="consumable capacity" if any(device.shared for device in cards) else None,
                replicas=None,
                memory_total=memory_total,
                allocatable={f"{preset.dra.driver if preset.dra else '?'} devices": str(len(here))},
                mig=dict(Counter(device.profile for device in migs if device.profile)),
                claimed=claimed[node],
                offered_modes=offered_modes(here, preset),
            )
        )
    return nodes


def claim_modes(uses: Sequence[ClaimUse]) -> dict[str, str]:
    """Kernel id -> the mode its claim was allocated in, where its claim had fallbacks."""
    return {use.kernel_id: use.mode for use in uses if use.kernel_id and use.mode}


def with_allocated_modes(slices: Sequence[PodSlice], uses: Sequence[ClaimUse]) -> list[PodSlice]:
    """Kernel pods with the mode their claim got (a firstAvailable fallback) instead of the
    mode they asked for: what ``GET kernels`` and ``%gpu status`` show."""
    modes = claim_modes(uses)
    return [replace(item, mode=modes[item.kernel_id]) if item.kernel_id in modes else item for item in slices]


def device_views(
    nodes: Sequence[NodeGPUs],
    devices: Sequence[DraDevice],
    uses: Sequence[ClaimUse],
    slices: Sequence[PodSlice],
    preset: ResourcePreset,
    usage: Mapping[str, Usage],
    viewer: str,
) -> list[DevicePayload]:
    """``GET pool`` devices: one per node, as the device-plugin view shows nodes, with each MIG
    device and who holds it (another user's kernel stays anonymous)."""
    holders: dict[tuple[str, str], ClaimUse] = {}
    for use in uses:
        for pool, name, _ in use.held:
            holders[(pool, name)] = use
    views: list[DevicePayload] = []
    for index, node in enumerate(nodes):
        here = [item for item in slices if item.node == node.name and item.placed]
        measured = [usage[item.kernel_id] for item in here if item.kernel_id in usage]
        instances: list[MigPayload] = []
        for device in sorted((d for d in devices if d.node == node.name and d.is_mig), key=lambda d: d.name):
            holder = holders.get(device.key)
            kernel = None
            if holder is not None and holder.kernel_id:
                kernel = visible_kernel_id(holder.kernel_id, holder.owner, viewer)
            instances.append(
                {
                    "uuid": device.uuid or f"{node.name}/{device.name}",
                    "profile": device.profile or "?",
                    "memory_total": device.memory,
                    "kernel_id": kernel,
                    "in_use": holder is not None,
                }
            )
        product = (node.product or "GPU").replace("-", " ")
        name = f"{node.cards}× {product}" if node.cards and node.cards > 1 else product
        views.append(
            {
                "id": index,
                "uuid": f"node/{node.name}",
                "name": f"{name} on {node.name}",
                "memory_total": node.memory_total,
                "memory_reserved": node.claimed or 0,
                "memory_used": sum(item.memory_used for item in measured),
                "utilization": None,
                "modes": list(node.offered_modes or ()),
                "mig": instances,
                "node": node.name,
                "cards": node.cards,
                "sharing": node.sharing,
                "allocatable": dict(node.allocatable),
            }
        )
    return views
