"""The JSON shapes of SPEC §7, typed once. Pure.

``jupyter_gpushare/openapi.yaml`` describes the wire; these TypedDicts are the same shapes for the
Python code that builds them (views of the ledger and of the cluster), and
tests/unit/test_payloads.py checks that both list the same fields, required and optional, as
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
    reason: NotRequired[str | None]  # Kubernetes: the scheduler's words


class PoolPayload(TypedDict):
    backend: str
    simulated: bool
    overcommit: float
    devices: list[DevicePayload]
    queue: list[QueuePayload]
    problem: NotRequired[str]  # why the view may be wrong or stale


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


class StatusPayload(TypedDict):
    """``jupyter gpushare status --json`` and the stream's ``usage`` event."""

    pool: PoolPayload
    kernels: list[KernelPayload]


__all__ = ["DevicePayload", "KernelPayload", "MigPayload", "PoolPayload", "QueuePayload", "StatusPayload"]
