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

# Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34): served by an API server
# made with ``dra=True`` (dra.py plays the DRA part of the scheduler and the claim controllers).
RESOURCE_SLICES = kmock.resource("resource.k8s.io", "v1", "resourceslices")
RESOURCE_CLAIMS = kmock.resource("resource.k8s.io", "v1", "resourceclaims")
RESOURCE_CLAIM_TEMPLATES = kmock.resource("resource.k8s.io", "v1", "resourceclaimtemplates")
DEVICE_CLASSES = kmock.resource("resource.k8s.io", "v1", "deviceclasses")
DRA_KINDS = {
    RESOURCE_SLICES: "ResourceSlice",
    RESOURCE_CLAIMS: "ResourceClaim",
    RESOURCE_CLAIM_TEMPLATES: "ResourceClaimTemplate",
    DEVICE_CLASSES: "DeviceClass",
}
DRA_NAMESPACED = {RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES}

# The scheduler's words for a node where a pod's claims cannot all be allocated.
CANNOT_ALLOCATE = "cannot allocate all claims"

# Kinds whose DELETE answers with the object, as the API does; the others answer with a Status.
DELETE_ANSWERS_OBJECT = {PODS, *DRA_KINDS}


def now() -> str:
    """A timestamp as the API writes one (RFC 3339, UTC, microseconds)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status_error(
    code: int, reason: str, message: str, name: str | None = None, kind: str | None = None
) -> KubernetesError:
    """A ``Status`` answer with the API's reason (kmock turns it into the HTTP reply)."""
    details = {"name": name, "kind": kind} if name else {}
    return KubernetesError(status=code, reason=reason, message=message, details=details)
