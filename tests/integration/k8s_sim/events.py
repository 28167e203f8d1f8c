"""Events about a pod, posted as the scheduler and kubelet post them (what ``kubectl describe``
and the provisioner's log read)."""

from __future__ import annotations

from typing import Any

from ...cluster.containers import pod_event
from .api import ApiServer
from .resources import EVENTS


async def post_event(
    api: ApiServer, pod: dict[str, Any], reason: str, message: str, kind: str, component: str
) -> None:
    """One ``Event`` about ``pod`` from ``component`` (``kind``: Normal or Warning)."""
    async with api._lock:
        await api.add(EVENTS, pod_event(pod, reason, message, kind, component))
