"""Placement of GPU slices: pure code, no I/O.

``fit`` answers one question — where does this request go right now (a :class:`Spot`), or why
not (a :class:`NoFit`) — from immutable values: the devices, the slices already held and the
policy. The ledger calls it inside a write transaction, so what ``fit`` sees is what it decides
on. A ``NoFit`` carries a sentence a person can read and whether waiting could help (``retry``),
which is what decides between the queue and an immediate failure: the request's outcome
(:class:`~jupyter_gpushare.core.records.Waiting` or
:class:`~jupyter_gpushare.core.records.Refused`) is the ledger's to say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.placement.queue_order import FIFO, QueueRule
from jupyter_gpushare.core.sizes import Size, format_bytes

# How a mode uses a device: many slices sharing its memory, the whole card, or one MIG instance.
Placement = Literal["shared", "exclusive", "mig"]


@dataclass(frozen=True)
class Request:
    """What a kernel asks for; ``at_least``: the least memory its card must have (an exclusive
    request of a size takes a whole card at least that large)."""

    kernel_id: str
    owner: str
    size: Size
    placement: Placement = "shared"
    at_least: Size | None = None


@dataclass(frozen=True)
class Held:
    """A slice already reserved on a device (or MIG instance ``unit_uuid``)."""

    kernel_id: str
    owner: str
    device_uuid: str
    unit_uuid: str
    memory: int
    whole_card: bool = False  # exclusive mode or a ``whole`` size: nobody else may share


@dataclass(frozen=True)
class Policy:
    """The admin's limits (docs/reference/configuration.md), and who of the waiting requests goes first."""

    overcommit: float = 1.0
    max_memory_per_kernel: int | None = None
    max_memory_per_user: int | None = None
    min_memory: int = 0  # bytes: no slice smaller (a share of a small card can be)
    queue: QueueRule = FIFO


@dataclass(frozen=True)
class Spot:
    """Where a request fits: the device (or MIG instance) and how many bytes it holds there."""

    device_uuid: str
    unit_uuid: str  # the device's UUID, or the MIG instance's
    memory: int
    whole_card: bool
    device_index: int


# Why a request does not fit, for callers that answer differently (the start picker's short words).
TOO_LARGE = "too_large"
KERNEL_LIMIT = "kernel_limit"
USER_LIMIT = "user_limit"
TOO_SMALL = "too_small"
NO_ROOM = "no_room"  # the only one waiting can change


@dataclass(frozen=True)
class NoFit:
    """Why a request does not fit now; ``retry`` is True when freed memory could change that (the
    ledger then queues it, else refuses it)."""

    reason: str
    retry: bool
    code: str = ""


def fit(
    request: Request,
    devices: Sequence[Device],
    held: Iterable[Held],
    policy: Policy = Policy(),
) -> Spot | NoFit:
    """Best-fit placement of ``request`` among ``devices`` given the slices ``held``.

    Slices of ``request.kernel_id`` itself are ignored, so the same call answers a resize.
    """
    if not devices:
        return NoFit("no GPU in the pool", retry=False)
    held = list(held)
    others = [slice_ for slice_ in held if slice_.kernel_id != request.kernel_id]
    if request.placement == "mig":
        return _fit_mig(request, devices, others, policy)
    own = [slice_ for slice_ in held if slice_.kernel_id == request.kernel_id]
    return _fit_card(request, devices, others, policy, own)


def fit_on_device(
    request: Request,
    device_uuid: str,
    devices: Sequence[Device],
    held: Iterable[Held],
    policy: Policy = Policy(),
) -> Spot | NoFit:
    """Like :func:`fit`, restricted to one device: a live resize cannot move a kernel.

    What no device of the pool could hold is refused with the pool's largest device, as
    :func:`fit` says it; what only this device cannot hold says so.
    """
    same = [device for device in devices if device.uuid == device_uuid]
    if not same:
        return NoFit("the kernel's device is no longer in the pool", retry=False)
    too_large = _larger_than_the_pool(request, devices)
    if too_large is not None:
        return too_large
    device = same[0]
    if request.size.form == "bytes" and request.size.resolve(0) > device.memory_total:
        return NoFit(
            f"{request.size} is larger than {device.label} ({format_bytes(device.memory_total)}), and a "
            "live resize cannot move a kernel to another GPU: shut the kernel down and start it with "
            f"{request.size}",
            retry=False,
        )
    return fit(request, same, held, policy)


def _larger_than_the_pool(request: Request, devices: Sequence[Device]) -> NoFit | None:
    usable = [device for device in devices if not device.mig_enabled]
    needed = request.at_least or request.size
    if needed.form != "bytes" or not usable:
        return None
    largest = max(usable, key=lambda device: device.memory_total)
    if needed.resolve(0) <= largest.memory_total:
        return None
    return NoFit(
        f"{needed} is larger than any GPU in the pool "
        f"(largest: {format_bytes(largest.memory_total)} on {largest.label})",
        retry=False,
        code=TOO_LARGE,
    )


def _fit_card(
    request: Request, devices: Sequence[Device], held: list[Held], policy: Policy, own: list[Held]
) -> Spot | NoFit:
    whole_card = request.placement == "exclusive" or request.size.is_whole
    usable = [device for device in devices if not device.mig_enabled]
    if not usable:
        return NoFit("every GPU is in MIG mode; ask for mode 'mig' or disable MIG on a card", retry=False)
    too_large = _larger_than_the_pool(request, usable)
    if too_large is not None:
        return too_large

    candidates: list[tuple[int, int, Device, int]] = []
    quota_refusals: list[NoFit] = []
    too_small: list[Device] = []
    for device in usable:
        wanted = device.memory_total if whole_card else request.size.resolve(device.memory_total)
        if wanted < policy.min_memory:
            too_small.append(device)  # a share of a small card can be below the smallest slice
            continue
        quota = _quota_refusal(request, wanted, held, policy)
        if quota is not None:
            quota_refusals.append(quota)
            continue
        if wanted > device.memory_total or (request.at_least and request.at_least.resolve(0) > wanted):
            continue  # overcommit stretches what is reserved, never one slice past the card
        on_device = [slice_ for slice_ in held if slice_.device_uuid == device.uuid]
        if any(slice_.whole_card for slice_ in on_device):
            continue
        if whole_card:
            if on_device:
                continue
            leftover = 0
        else:
            capacity = int(device.memory_total * policy.overcommit)
            leftover = capacity - sum(slice_.memory for slice_ in on_device) - wanted
            if leftover < 0:
                continue
        # Best fit: the device left with the least room; ties go to the lower index.
        candidates.append((leftover, device.index, device, wanted))

    if candidates:
        _, _, device, wanted = min(candidates, key=lambda candidate: candidate[:2])
        return Spot(device.uuid, device.uuid, wanted, whole_card, device.index)
    if len(too_small) == len(usable):
        return NoFit(
            f"{request.size} is below the smallest GPU slice, {format_bytes(policy.min_memory)} "
            "(GPUShare.min_memory), on every GPU of the pool",
            retry=False,
            code=TOO_SMALL,
        )
    if len(quota_refusals) + len(too_small) == len(usable):
        # Quotas do not change by waiting for other users' kernels to end: fail now.
        return quota_refusals[0]
    return NoFit(_does_not_fit(request, usable, held, policy, whole_card, own), retry=True, code=NO_ROOM)


def _fit_mig(request: Request, devices: Sequence[Device], held: list[Held], policy: Policy) -> Spot | NoFit:
    if request.size.is_whole:
        return NoFit("'whole' is not a MIG size; use mode 'exclusive' for a whole card", retry=False)
    taken = {slice_.unit_uuid for slice_ in held}
    fitting: list[tuple[int, int, Device, str]] = []
    quota_refusals: list[NoFit] = []
    any_big_enough = False
    for device in devices:
        for instance in device.mig:
            # A share (25%) of a MIG request is read against the parent card.
            wanted = request.size.resolve(device.memory_total)
            if instance.memory_total < wanted:
                continue
            any_big_enough = True
            if instance.uuid in taken:
                continue
            quota = _quota_refusal(request, instance.memory_total, held, policy)
            if quota is not None:
                quota_refusals.append(quota)  # a smaller free instance may still be within it
                continue
            fitting.append((instance.memory_total, device.index, device, instance.uuid))
    if not any(device.mig for device in devices):
        return NoFit("no GPU in the pool has MIG instances; ask an admin to enable MIG", retry=False)
    if fitting:
        memory, _, device, unit_uuid = min(fitting, key=lambda candidate: candidate[:2])
        return Spot(device.uuid, unit_uuid, memory, False, device.index)
    if quota_refusals:
        return quota_refusals[0]
    if not any_big_enough:
        biggest = max(instance.memory_total for device in devices for instance in device.mig)
        return NoFit(
            f"{request.size} is larger than any MIG instance (largest: {format_bytes(biggest)})",
            retry=False,
            code=TOO_LARGE,
        )
    return NoFit(
        f"{request.size} does not fit: every MIG instance that large is in use", retry=True, code=NO_ROOM
    )


def _quota_refusal(request: Request, wanted: int, held: list[Held], policy: Policy) -> NoFit | None:
    reason = kernel_limit_refusal(wanted, policy.max_memory_per_kernel)
    if reason is not None:
        return NoFit(reason, retry=False, code=KERNEL_LIMIT)
    if policy.max_memory_per_user is None:
        return None  # (what the owner holds is summed only where there is a limit to hold it to)
    in_use = sum(slice_.memory for slice_ in held if slice_.owner == request.owner)
    reason = user_limit_refusal(request.owner, wanted, in_use, policy.max_memory_per_user)
    return None if reason is None else NoFit(reason, retry=False, code=USER_LIMIT)


def kernel_limit_refusal(wanted: int, limit: int | None) -> str | None:
    """Why ``wanted`` bytes break the per-kernel limit, or None."""
    if limit is None or wanted <= limit:
        return None
    return f"{format_bytes(wanted)} is above the per-kernel limit of {format_bytes(limit)}"


def user_limit_refusal(
    owner: str, wanted: int, held: int, limit: int | None, holders: str = ""
) -> str | None:
    """Why ``wanted`` more bytes would take ``owner`` (holding ``held``) past the per-user limit,
    or None; ``holders`` names what holds them (" by their kernel pods")."""
    if limit is None or held + wanted <= limit:
        return None
    return (
        f"{format_bytes(wanted)} would take {owner} to {format_bytes(held + wanted)}, above the "
        f"per-user limit of {format_bytes(limit)} ({format_bytes(held)} already held{holders})"
    )


def free_memory(device: Device, held: Iterable[Held], overcommit: float) -> int:
    """Bytes still reservable on ``device`` (what "free" means everywhere: memory no slice in
    ``held`` has reserved, under the overcommit): zero when a whole-card slice holds it."""
    on_device = [slice_ for slice_ in held if slice_.device_uuid == device.uuid]
    if any(slice_.whole_card for slice_ in on_device):
        return 0
    capacity = int(device.memory_total * overcommit)
    return max(0, capacity - sum(slice_.memory for slice_ in on_device))


def _does_not_fit(
    request: Request,
    usable: Sequence[Device],
    others: list[Held],
    policy: Policy,
    whole_card: bool,
    own: list[Held],
) -> str:
    if whole_card:
        busy = ", ".join(device.label for device in usable)
        return f"{request.size} does not fit: no GPU is free of other slices ({busy} in use)"
    # Free counts this kernel's own slice as taken, as everywhere else; where it holds one (a
    # resize), what it could grow to is said beside it: that slice plus what is free.
    everyone = [*others, *own]
    frees = sorted(
        ((free_memory(device, everyone, policy.overcommit), device) for device in usable),
        key=lambda pair: (-pair[0], pair[1].index),
    )
    shown = []
    for free, device in frees[:4]:
        text = f"{format_bytes(free)} free on {device.label}"
        if any(slice_.device_uuid == device.uuid for slice_ in own):
            room = min(device.memory_total, free_memory(device, others, policy.overcommit))
            text += f", so this kernel can grow to {format_bytes(room)}"
        shown.append(text)
    return f"{request.size} does not fit: " + ("; " if own else ", ").join(shown)
