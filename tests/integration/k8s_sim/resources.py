"""The kinds the simulated cluster serves, and what every part of it says the API's way.

Imported by every other module of the simulator: the resource handles kmock routes requests by,
which kinds live in a namespace, the API's timestamps, and its ``Status`` errors.
"""

from __future__ import annotations

import datetime

import kmock
from kmock import KubernetesError

PODS = kmock.resource("", "v1", "pods")
SECRETS = kmock.resource("", "v1", "secrets")
EVENTS = kmock.resource("", "v1", "events")
NODES = kmock.resource("", "v1", "nodes")
KINDS = {PODS: "Pod", SECRETS: "Secret", EVENTS: "Event", NODES: "Node"}
NAMESPACED = {PODS, SECRETS, EVENTS}


def now() -> str:
    """A timestamp as the API writes one (RFC 3339, UTC, microseconds)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status_error(
    code: int, reason: str, message: str, name: str | None = None, kind: str | None = None
) -> KubernetesError:
    """A ``Status`` answer with the API's reason (kmock turns it into the HTTP reply)."""
    details = {"name": name, "kind": kind} if name else {}
    return KubernetesError(status=code, reason=reason, message=message, details=details)
