"""The Kubernetes pool as docs/reference/rest-api.md shows it: GPU nodes as devices, our kernel pods
as slices. Pure.

A node is one entry of ``GET pool`` (Kubernetes places pods on nodes, not on cards, so a node's
cards are shown together): its GPU Feature Discovery labels (``nvidia.com/gpu.product``,
``.memory``, ``.count``, ``.sharing-strategy``, ``.replicas``) and its allocatable GPU
resources say what it offers. What is reserved on it is what our kernel pods there asked for —
pods of other applications are not ours to read, and the docs say so.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.kueue import held_by_kueue, queued_by_kueue
from jupyter_gpushare.backends.kubernetes.objects.manifests import SERVER_LABEL, SIZE_ANNOTATION
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.core.payloads import (
    DevicePayload,
    KernelPayload,
    MigPayload,
    PoolPayload,
    QueuePayload,
    State,
)
from jupyter_gpushare.core.pods.cluster import NodeGPUs, counts_virtual_gpus
from jupyter_gpushare.core.pods.presets import ResourcePreset
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.core.sizes import GiB, MiB, format_bytes
from jupyter_gpushare.core.visibility import kernel_as_seen, queue_entry_as_seen, visible_kernel_id
from jupyter_gpushare.core.watchdog import DeviceUsage, KernelUsage, assess

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB per card
GFD_COUNT = "nvidia.com/gpu.count"
GFD_SHARING = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
GFD_REPLICAS = "nvidia.com/gpu.replicas"
_MIG_MEMORY_SUFFIX = "gb"


@dataclass(frozen=True)
class PodSlice:
    """One kernel pod of ours, as its manifest and status describe it."""

    kernel_id: str
    pod: str
    owner: str
    server: str  # the server label
    mode: str | None
    size: str | None
    memory: int | None  # bytes the slice stands for, where known
    node: str | None
    phase: str
    created: str
    unschedulable: str | None  # the scheduler's message while it cannot be placed
    deleting: bool
    # The LocalQueue of a pod Kueue holds behind its admission gate: it waits for quota, and the
    # scheduler has not looked at it yet (None: not held).
    held_by_kueue: str | None = None

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def placed(self) -> bool:
        return bool(self.node) and not self.ended


Usage = UsageReport  # a kernel pod's latest use: its own report, or the cluster's metrics


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _gpu_resource(name: str, preset: ResourcePreset) -> bool:
    names = {preset.gpu, preset.timeslice_gpu, preset.mps_gpu, preset.vgpu_count, preset.vgpu_memory}
    names |= {preset.vgpu_cores, preset.vgpu_memory_percent}
    return name in names or name.startswith(preset.mig_prefix) or name.startswith("nvidia.com/")


def read_node(node: Mapping[str, Any], preset: ResourcePreset) -> NodeGPUs | None:
    """The node's GPUs, or None for a node that offers none."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    allocatable = {
        str(name): str(quantity)
        for name, quantity in ((node.get("status") or {}).get("allocatable") or {}).items()
        if _gpu_resource(str(name), preset) and str(quantity) not in ("", "0")
    }
    mig = {
        name[len(preset.mig_prefix) :]: _int(quantity) or 0
        for name, quantity in allocatable.items()
        if name.startswith(preset.mig_prefix)
    }
    if not allocatable and GFD_PRODUCT not in labels:
        return None
    card_mib = _int(labels.get(GFD_MEMORY))
    card_memory = card_mib * MiB if card_mib else None
    replicas = _int(labels.get(GFD_REPLICAS))
    cards = _int(labels.get(GFD_COUNT))
    sharing = labels.get(GFD_SHARING) or None
    if cards is None and preset.gpu in allocatable and not counts_virtual_gpus(preset, allocatable):
        advertised = _int(allocatable[preset.gpu]) or 0
        cards = advertised // replicas if replicas and sharing not in (None, "none") else advertised
    memory_total = _offered_memory(preset, allocatable, card_memory, cards, mig)
    return NodeGPUs(
        name=str(metadata.get("name") or "?"),
        product=labels.get(GFD_PRODUCT) or None,
        card_memory=card_memory,
        cards=cards,
        sharing=sharing,
        replicas=replicas,
        memory_total=memory_total,
        allocatable=allocatable,
        mig=mig,
    )


def _offered_memory(
    preset: ResourcePreset,
    allocatable: Mapping[str, str],
    card_memory: int | None,
    cards: int | None,
    mig: Mapping[str, int],
) -> int:
    if preset.vgpu_memory and preset.vgpu_memory in allocatable:
        unit = GiB if preset.vgpu_memory_unit == "GiB" else MiB
        return (_int(allocatable[preset.vgpu_memory]) or 0) * unit
    if card_memory and cards:
        return card_memory * cards
    return sum(mig_memory(profile) * count for profile, count in mig.items())


def mig_memory(profile: str) -> int:
    """Bytes of a MIG profile such as ``3g.40gb`` (0 when the name says nothing)."""
    _, _, memory = profile.partition(".")
    return (_int(memory.removesuffix(_MIG_MEMORY_SUFFIX)) or 0) * GiB


def node_modes(node: NodeGPUs, preset: ResourcePreset) -> list[str]:
    """The modes a kernel pod may ask of this node: each mode says whether the node's resources
    and labels offer it (under DRA, its devices did: :mod:`.dra_pool`)."""
    if node.offered_modes is not None:
        return list(node.offered_modes)
    return [name for name, mode in MODES.items() if mode.offered_on_node(node, preset)]


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(item.get("name")): str(item.get("value"))
        for item in container.get("env") or []
        if item.get("value") is not None
    }


def epoch_seconds(timestamp: str) -> float:
    """Seconds since the epoch of an API timestamp (``2026-11-29T17:00:00Z``); 0 when unreadable."""
    try:
        return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def read_pod(pod: Mapping[str, Any]) -> PodSlice | None:
    """Our kernel pod's slice, or None for a pod that is not a kernel of ours."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    kernel = next((c for c in spec.get("containers") or [] if c.get("name") == "kernel"), None)
    if kernel is None:
        return None
    env = _env(kernel)
    kernel_id = env.get(env_names.KERNEL_ID)
    if not kernel_id:
        return None
    unschedulable = None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            unschedulable = str(condition.get("message") or "unschedulable")
    return PodSlice(
        kernel_id=kernel_id,
        pod=str(metadata.get("name") or ""),
        owner=env.get(env_names.OWNER, ""),
        server=str((metadata.get("labels") or {}).get(SERVER_LABEL, "")),
        mode=env.get(env_names.MODE),
        size=(metadata.get("annotations") or {}).get(SIZE_ANNOTATION),
        memory=_int(env.get(env_names.MEMORY_BYTES)),
        node=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Pending"),
        created=str(metadata.get("creationTimestamp") or ""),
        unschedulable=None if spec.get("nodeName") else unschedulable,
        deleting=bool(metadata.get("deletionTimestamp")),
        held_by_kueue=held_by_kueue(pod),
    )


def held_by_user(slices: Sequence[PodSlice], owner: str, excluding: str | None = None) -> int:
    """Bytes ``owner``'s kernel pods hold or wait for, in every server of theirs."""
    return sum(
        item.memory or 0
        for item in slices
        if item.owner == owner and not item.ended and not item.deleting and item.kernel_id != excluding
    )


def never_fits(wanted: int, nodes: Sequence[NodeGPUs]) -> str | None:
    """Why no node could ever hold a slice of ``wanted`` bytes (None when one could, or when the
    nodes say nothing of their memory). A slice lives on one card, so cards are compared."""
    sizes = [node.card_memory or node.memory_total for node in nodes if node.card_memory or node.memory_total]
    if not sizes or wanted <= max(sizes):
        return None
    return (
        f"{format_bytes(wanted)} does not fit on any GPU node of the cluster: the largest card "
        f"has {format_bytes(max(sizes))}"
    )


def waiting(slices: Sequence[PodSlice]) -> list[PodSlice]:
    """Pods not yet placed, oldest first: the cluster's queue as far as we can see it."""
    return sorted(
        (s for s in slices if not s.node and not s.ended and not s.deleting), key=lambda s: s.created
    )


def queue_positions(slices: Sequence[PodSlice]) -> dict[str, int]:
    """Each waiting pod's place in the cluster's queue (1: next)."""
    return {item.kernel_id: position for position, item in enumerate(waiting(slices), start=1)}


def pool_view(
    nodes: Sequence[NodeGPUs],
    slices: Sequence[PodSlice],
    preset: ResourcePreset,
    usage: Mapping[str, Usage],
    *,
    viewer: str,
    problem: str | None = None,
    devices: Sequence[DevicePayload] | None = None,
) -> PoolPayload:
    """``GET pool`` for the Kubernetes backend; ``devices`` are the nodes' views where the caller
    built them (from DRA objects), else they are made from ``nodes`` here."""
    queue: list[QueuePayload] = [
        queue_entry_as_seen(
            {
                "position": position,
                "kernel_id": item.kernel_id,
                "owner": item.owner,
                "memory_request": item.memory,
                "size": item.size or "",
                "mode": item.mode or "",
                "requested_at": epoch_seconds(item.created),
                # The scheduler's words; for a pod behind Kueue's gate, Kueue's queue (its
                # Workload's reason is read where a start is followed, not for every pool view).
                "reason": item.unschedulable
                or (queued_by_kueue(item.held_by_kueue) if item.held_by_kueue else None),
            },
            viewer,
        )
        for position, item in enumerate(waiting(slices), start=1)
    ]
    view: PoolPayload = {
        "backend": "kubernetes",
        "simulated": False,
        "overcommit": 1.0,
        "devices": list(devices)
        if devices is not None
        else [_node_view(index, node, slices, preset, usage, viewer) for index, node in enumerate(nodes)],
        "queue": queue,
    }
    if problem:
        view["problem"] = problem
    return view


def _node_view(
    index: int,
    node: NodeGPUs,
    slices: Sequence[PodSlice],
    preset: ResourcePreset,
    usage: Mapping[str, Usage],
    viewer: str,
) -> DevicePayload:
    here = [item for item in slices if item.node == node.name and item.placed]
    measured = [usage[item.kernel_id] for item in here if item.kernel_id in usage]
    mig_slices = [item for item in here if _holds_mig(item)]
    instances: list[MigPayload] = []
    for profile, count in sorted(node.mig.items()):
        holders = [item for item in mig_slices if item.size and _profile_of(item, profile)]
        for number in range(count):
            holder = holders[number] if number < len(holders) else None
            instances.append(
                {
                    "uuid": f"{node.name}/mig-{profile}/{number}",
                    "profile": profile,
                    "memory_total": mig_memory(profile),
                    "kernel_id": visible_kernel_id(holder.kernel_id, holder.owner, viewer)
                    if holder
                    else None,
                    "in_use": holder is not None,
                }
            )
    product = (node.product or "GPU").replace("-", " ")
    name = f"{node.cards}× {product}" if node.cards and node.cards > 1 else product
    return {
        "id": index,
        "uuid": f"node/{node.name}",
        "name": f"{name} on {node.name}",
        "memory_total": node.memory_total,
        "memory_reserved": sum(item.memory or 0 for item in here),
        "memory_used": sum(item.memory_used for item in measured),
        "utilization": None,
        "modes": node_modes(node, preset),
        "mig": instances,
        "node": node.name,
        "cards": node.cards,
        "sharing": node.sharing,
        "allocatable": dict(node.allocatable),
    }


def _holds_mig(item: PodSlice) -> bool:
    """Whether the pod's mode gives it a MIG device."""
    mode = MODES.get(item.mode or "")
    return mode is not None and mode.placement == "mig"


def _profile_of(item: PodSlice, profile: str) -> bool:
    return item.memory == mig_memory(profile)


def kernel_view(
    item: PodSlice,
    nodes: Sequence[NodeGPUs],
    slices: Sequence[PodSlice],
    usage: Usage | None,
    *,
    viewer: str,
    kernel_name: str = "",
    path: str = "",
    detail: str | None = None,
    positions: Mapping[str, int] | None = None,
    expected_start: float | None = None,
) -> KernelPayload:
    """One entry of ``GET kernels`` for a kernel pod; ``detail`` is what its start is doing.
    ``positions`` (from :func:`queue_positions`) saves working the queue out again per pod;
    ``expected_start``: when a waiting pod is expected to start, where estimated (Kueue's
    queues, through the broker)."""
    index_of = {node.name: index for index, node in enumerate(nodes)}
    position = (positions if positions is not None else queue_positions(slices)).get(item.kernel_id)
    state: State = "running" if item.placed and item.phase == "Running" else "queued"
    if item.ended:
        state = "released"
    if detail is None:
        detail = f"pending: {item.unschedulable}" if item.unschedulable else f"pod {item.phase.lower()}"
    warnings: list[str] = []
    if usage is not None and item.memory:
        node = next((n for n in nodes if n.name == item.node), None)
        device = DeviceUsage(item.node or "?", node.memory_total if node else 0, None, None)
        verdict = assess(
            KernelUsage(item.kernel_id, item.memory, usage.memory_used, usage.utilization), device, (), 1.0
        )
        warnings = list(verdict.warnings)
    view: KernelPayload = {
        "kernel_id": item.kernel_id,
        "kernel_name": kernel_name,
        "path": path,
        "owner": item.owner,
        "state": state,
        "queue_position": position if state == "queued" else None,
        "device": index_of.get(item.node) if item.node else None,
        "mode": item.mode,
        "memory_request": item.memory,
        "size": item.size,
        "memory_used": usage.memory_used if usage else 0,
        "utilization": usage.utilization if usage else None,
        "usage_source": usage.source if usage else None,
        "held": 0,
        "warnings": warnings,
        "pod": item.pod,
        "node": item.node,
        "detail": detail,
    }
    if state == "queued" and expected_start is not None:
        view["expected_start"] = expected_start
    return kernel_as_seen(view, viewer)
