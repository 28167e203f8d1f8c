"""The JSON shapes of docs/reference/rest-api.md, typed once. Pure.

``jupyter_gpushare/openapi.yaml`` describes the wire; these TypedDicts are the same shapes for the
Python code that builds them (views of the ledger and of the cluster), and
tests/unit/core/test_payloads.py checks that both list the same fields, required and optional, as
tests/unit/test_labextension_types.py does for the TypeScript types. (No ``from __future__
import annotations`` here: TypedDict reads ``NotRequired`` at runtime.)
"""

import sys
from typing import Literal, TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

State = Literal["queued", "running", "released", "suspended"]


class MigPayload(TypedDict):
    uuid: str
    profile: str
    memory_total: int
    kernel_id: str | None  # None when free or held by another user
    in_use: bool


class DevicePayload(TypedDict):
    id: int
    uuid: str
    name: str
    memory_total: int
    memory_reserved: int
    memory_used: int
    utilization: int | None
    modes: list[str]
    mig: list[MigPayload]
    # Kubernetes: a device is a GPU node.
    node: NotRequired[str]
    cards: NotRequired[int | None]
    sharing: NotRequired[str | None]
    allocatable: NotRequired[dict[str, str]]


class QueuePayload(TypedDict):
    position: int
    kernel_id: str | None  # None for another user's request
    owner: str
    memory_request: int | None
    size: str
    mode: str
    requested_at: float
    reason: NotRequired[str | None]  # Kubernetes: the scheduler's words, or Kueue's queue


class PoolPayload(TypedDict):
    backend: str
    simulated: bool
    overcommit: float
    devices: list[DevicePayload]
    queue: list[QueuePayload]
    problem: NotRequired[str]  # why the view may be wrong or stale


class CapabilitiesPayload(TypedDict):
    """What the backend of one of this server's kernels can do with its slice (the panel's
    buttons and the commands follow it, never the backend's kind)."""

    can_request: bool  # take a slice again while the kernel runs without one
    can_release: bool  # give the slice back while the kernel runs on
    can_suspend: bool  # move the GPU state to host memory and back (suspend, resume)
    can_force_shrink: bool  # shrink below what the kernel holds, that memory kept reserved
    resize_restarts: bool  # every resize restarts the kernel (a kernel pod: a new pod)


class KernelPayload(TypedDict):
    kernel_id: str | None  # None only for another user's slice
    kernel_name: str
    path: str
    owner: str
    state: State
    queue_position: int | None
    device: int | None
    mode: str | None
    memory_request: int | None
    size: str | None
    memory_used: int
    utilization: int | None
    usage_source: str | None
    warnings: list[str]
    held: int  # bytes its processes hold beyond its slice (or without one), kept reserved
    suspended_bytes: NotRequired[int | None]  # GPU state kept in host memory while suspended
    pod: NotRequired[str | None]
    node: NotRequired[str | None]
    detail: NotRequired[str | None]
    # This server's kernel that no session refers to and no client uses (shut down after
    # GPUShare.unused_kernel_timeout).
    unused: NotRequired[bool]
    # What its backend can do with its slice (this server's own kernels only).
    capabilities: NotRequired[CapabilitiesPayload]
    # A queued start: when it is expected to get its slice (seconds since the epoch), null when
    # there is no history to tell (the local backend's estimate; absent elsewhere).
    expected_start: NotRequired[float | None]
    # Its cells, as the kernel reports them: since when it is idle (null while a cell runs), and
    # what its idle timer will do when (GPUShare.idle_release_after, idle_action).
    idle_since: NotRequired[float | None]
    idle_action: NotRequired[Literal["suspend", "release"] | None]
    idle_action_at: NotRequired[float | None]


class StatusPayload(TypedDict):
    """``jupyter gpushare status --json`` and the stream's ``usage`` event."""

    pool: PoolPayload
    kernels: list[KernelPayload]


class UsageRowPayload(TypedDict):
    """One row of ``GET usage``: a user's, a group's or a kernel's figures over the period."""

    key: str
    label: str
    # A kernel's row (``by=kernel``): whose it is, when it first asked for a slice (ISO 8601),
    # its notebook (null: not started from one) and kernelspec; null in other rows.
    owner: str | None
    started: str | None
    notebook: str | None
    kernelspec: str | None
    kernels: int
    reserved_gib_hours: float
    used_gib_hours: float
    used_share: float | None  # used / reserved; null when nothing was reserved
    busy_hours: float  # holding a slice while a cell ran
    idle_hours: float  # holding a slice with no cell running
    suspended_hours: float
    queue_wait_hours: float  # every request's time in the queue
    starts: int  # slices placed: each kernel's first, and every one after (restarts, resumes)
    mean_start_wait_seconds: float | None
    suspends: int
    resumes: int


class UserSeriesPayload(TypedDict):
    user: str
    reserved: list[int]  # mean bytes reserved in each step
    used: list[int]  # mean bytes used in each step


class UsageSeriesPayload(TypedDict):
    start: float  # seconds since the epoch of the first step
    step: float  # seconds per point
    users: list[UserSeriesPayload]


class UsagePayload(TypedDict):
    """``GET usage`` and ``jupyter gpushare report --format json``."""

    since: str  # ISO 8601
    until: str
    by: Literal["user", "group", "kernel"]
    scope: Literal["self", "everyone"]  # a user sees themself; an admin everyone
    rows: list[UsageRowPayload]
    total: UsageRowPayload
    test_kernels: UsageRowPayload  # the doctor's test kernels: in no row, nor in the total
    series: UsageSeriesPayload


__all__ = [
    "DevicePayload",
    "KernelPayload",
    "MigPayload",
    "PoolPayload",
    "QueuePayload",
    "StatusPayload",
    "UsagePayload",
    "UsageRowPayload",
    "UsageSeriesPayload",
    "UserSeriesPayload",
]
