"""One JSON call over HTTP as the tests' clients make it (a jupyter server, JupyterLab, the hub,
a kernel pod): the status and the body, parsed as JSON where it is JSON, never an exception for
an error status."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any


def json_call(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    headers: Mapping[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    if data is None and method in ("POST", "PATCH", "PUT"):
        data = b""
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, answer = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, answer = error.code, error.read()
    if not answer:
        return status, None
    try:
        return status, json.loads(answer)
    except ValueError:
        return status, answer.decode(errors="replace")
