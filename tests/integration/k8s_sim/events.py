"""Events about a pod, posted as the scheduler and kubelet post them (what ``kubectl describe``
and the provisioner's log read)."""

from __future__ import annotations

from typing import Any

from .api import ApiServer
from .resources import EVENTS, now


async def post_event(
    api: ApiServer, pod: dict[str, Any], reason: str, message: str, kind: str, component: str
) -> None:
    """One ``Event`` about ``pod`` from ``component`` (``kind``: Normal or Warning)."""
    metadata = pod["metadata"]
    stamp = now()
    async with api._lock:
        await api.add(
            EVENTS,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": metadata["name"],
                    "namespace": metadata["namespace"],
                    "uid": metadata["uid"],
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "source": {"component": component},
                "reportingComponent": component,
            },
        )
