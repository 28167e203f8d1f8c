"""Label and field selectors as the API reads them, for lists and watches.

The API server (api.py) builds one matcher per request from its ``labelSelector`` and
``fieldSelector`` parameters; what cannot be parsed, or a field the kind cannot be selected on,
is the API's 400 ``BadRequest``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import kmock

from .resources import (
    DEVICE_CLASSES,
    EVENTS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    status_error,
)

# Fields each kind can be selected on (the API refuses others with 400).
FIELDS = {
    PODS: {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName", "status.phase"},
    SECRETS: {"metadata.name", "metadata.namespace", "type"},
    EVENTS: {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.fieldPath",
        "reason",
        "type",
        "source",
    },
    NODES: {"metadata.name", "spec.unschedulable"},
    RESOURCE_SLICES: {"metadata.name", "spec.nodeName", "spec.driver"},
    RESOURCE_CLAIMS: {"metadata.name", "metadata.namespace"},
    RESOURCE_CLAIM_TEMPLATES: {"metadata.name", "metadata.namespace"},
    DEVICE_CLASSES: {"metadata.name"},
}

_REQUIREMENT = re.compile(
    r"^\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$"
)


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def label_matcher(text: str) -> Callable[[dict[str, str]], bool]:
    """The API's label selector syntax: ``a=b``, ``a==b``, ``a!=b``, ``a in (b,c)``,
    ``a notin (b)``, ``a``, ``!a``; requirements are ANDed."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for part in _split(text):
        match = _REQUIREMENT.match(part)
        if not match or (match.group("not") and match.group("op")):
            raise status_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        key, op, value = match.group("key"), (match.group("op") or "").strip(), match.group("value")
        if not op:
            absent = bool(match.group("not"))
            checks.append(lambda labels, k=key, a=absent: (k in labels) != a)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        else:
            if not value or not value.startswith("("):
                raise status_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
            values = {item.strip() for item in value[1:-1].split(",")}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
    return lambda labels: all(check(labels) for check in checks)


def field_matcher(text: str, resource: kmock.resource) -> Callable[[dict[str, Any]], bool]:
    """The API's field selector syntax (``path=value``, ``path==value``, ``path!=value``, ANDed)
    over the fields ``resource`` can be selected on; a missing field reads as ``""``."""
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split(text):
        match = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not match:
            raise status_error(400, "BadRequest", f"invalid field selector: {part!r}")
        path, op, value = match.groups()
        if path not in FIELDS[resource]:
            raise status_error(400, "BadRequest", f"field label not supported: {path}")

        def get(obj: dict[str, Any], path: str = path) -> str:
            current: Any = obj
            for step in path.split("."):
                current = (current or {}).get(step) if isinstance(current, dict) else None
            if isinstance(current, dict) and path == "source":
                current = current.get("component")
            return "" if current is None else str(current)

        if op == "!=":
            checks.append(lambda obj, g=get, v=value: g(obj) != v)
        else:
            checks.append(lambda obj, g=get, v=value: g(obj) == v)
    return lambda obj: all(check(obj) for check in checks)
