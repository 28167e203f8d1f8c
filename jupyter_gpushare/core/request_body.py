"""Reading a request without trusting it: limits first, then JSON, then text checks (pure).

Every door reads its requests through this module: the server's REST API and the GPU broker's
socket and HTTP service. Everything here is checked *before* the part that could cost too much:
the size before parsing, the nesting before the recursive parser (which raises
``RecursionError`` around 1,000 levels), and the strings before any of them reaches sqlite or a
client (a lone surrogate cannot be stored as UTF-8, an escape sequence must not reach a
terminal). Every refusal is a :class:`~jupyter_gpushare.core.errors.RequestBodyError` (400; 413 for
a body too large, 431 for headers) that says which limit was broken; nothing was changed.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from jupyter_gpushare.core.errors import (
    BodyTooLargeError,
    HeadersTooLargeError,
    InvalidRequestError,
    RequestBodyError,
)
from jupyter_gpushare.core.slice_request import MAX_NAME_BYTES, MAX_PATH_BYTES

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "activity_report",
    "check_headers",
    "check_kernel_id",
    "check_label",
    "json_object",
    "json_value",
]

MAX_BODY_BYTES = 64 * 1024  # the largest body any route needs is a few hundred bytes
MAX_HEADER_BYTES = 32 * 1024  # a request line and headers: a path, a token, a few names
MAX_NESTING = 32  # levels of arrays and objects; our bodies are flat
CLOCK_SLACK = 3600.0  # seconds a kernel's report of its cells may lie in the past
# A kernel id as jupyter_client makes them (uuid4): the only form stored, shown and passed on.
KERNEL_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")
_DEPTH_CHANGE = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, without parsing it."""
    outside_strings = _STRINGS.sub(b"", raw)
    changes = (_DEPTH_CHANGE[match[0]] for match in _BRACKETS.findall(outside_strings))
    return max(itertools.accumulate(changes, initial=0))


def too_large(size: int, max_bytes: int = MAX_BODY_BYTES) -> BodyTooLargeError:
    return BodyTooLargeError(f"the request body is {size} bytes; at most {max_bytes} bytes are accepted")


def json_value(raw: bytes, max_bytes: int = MAX_BODY_BYTES, max_nesting: int = MAX_NESTING) -> Any:
    """A body as JSON, refused when it is too large (413), too deep or not text (400)."""
    if len(raw) > max_bytes:
        raise too_large(len(raw), max_bytes)
    if not raw.strip():
        return {}
    if nesting_depth(raw) > max_nesting:
        raise RequestBodyError(f"the request body nests deeper than {max_nesting} levels of JSON")
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RequestBodyError("the request body is not valid JSON") from None
    problem = _not_text(value)
    if problem is not None:
        raise RequestBodyError(f"the request body has a string that is not valid text: {problem}")
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    """A body that must be a JSON object (an empty body is ``{}``)."""
    value = json_value(raw)
    if not isinstance(value, dict):
        raise RequestBodyError("the request body must be a JSON object")
    return value


def check_label(name: str, value: object, max_bytes: int) -> str:
    """A name or path a client sends, to be stored and shown to every client: short, no
    control characters (a NUL, a newline, an escape sequence)."""
    if not isinstance(value, str):
        raise RequestBodyError(f"{name} must be a string, not {_shown(value)}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise RequestBodyError(f"{name} is {size} bytes long; at most {max_bytes} bytes are accepted")
    control = next((char for char in value if unicodedata.category(char) == "Cc"), None)
    if control is not None:
        raise RequestBodyError(f"{name} must not contain control characters such as {control!r}")
    return value


def check_kernel_id(value: object, name: str = "kernel_id") -> str:
    """A kernel id as jupyter_client makes them (a UUID); anything else is refused, so no id
    that is stored, logged or shown can carry a NUL, an escape sequence or a path."""
    if not isinstance(value, str) or not KERNEL_ID.fullmatch(value):
        raise RequestBodyError(
            f"{name} must be a kernel id (a UUID such as 0b5ad5ec-9c1e-4a4f-8d0e-3d2b6a1c7f00), "
            f"not {_shown(value)}"
        )
    return value


def activity_report(body: object, now: float) -> tuple[bool, float, float, str]:
    """``(busy, at, idle_after, idle_action)`` of a kernel's report of its cells (``{"busy",
    "at", "idle_after", "idle_action"}``: to its broker, or a kernel pod's to its server), checked."""
    if not isinstance(body, dict):
        raise InvalidRequestError(
            'send {"busy": true|false, "at": SECONDS, "idle_after": SECONDS, "idle_action": …}'
        )
    busy, at = body.get("busy"), body.get("at")
    idle_after, action = body.get("idle_after", 0), body.get("idle_action", "suspend")
    if not isinstance(busy, bool):
        raise InvalidRequestError(f"busy must be true or false, not {json.dumps(busy)}")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not now - CLOCK_SLACK <= at <= now + 60:
        raise InvalidRequestError(
            "at must be the time of the change in seconds since the epoch, within the last hour, "
            f"not {json.dumps(at)}"
        )
    if isinstance(idle_after, bool) or not isinstance(idle_after, (int, float)) or not 0 <= idle_after < 1e9:
        raise InvalidRequestError(f"idle_after must be a number of seconds, not {json.dumps(idle_after)}")
    if action not in ("suspend", "release"):
        raise InvalidRequestError(f'idle_action must be "suspend" or "release", not {json.dumps(action)}')
    return busy, float(at), float(idle_after), str(action)


def check_headers(request_line: str, headers: Iterable[tuple[str, str]]) -> None:
    """Refuse (431) a request whose line and headers together pass :data:`MAX_HEADER_BYTES`."""
    size = len(request_line) + sum(len(name) + len(value) + 4 for name, value in headers)
    if size > MAX_HEADER_BYTES:
        raise HeadersTooLargeError(
            f"the request line and headers are {size} bytes; at most {MAX_HEADER_BYTES} bytes are accepted"
        )


def _shown(value: object, limit: int = 60) -> str:
    """A value as JSON (control characters escaped), cut short: safe to put in a message."""
    text = json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit]}…"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _not_text(value: Any) -> str | None:
    """The first string (key or value) that UTF-8 cannot carry, described; None if all can."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                return f"{item[error.start : error.end]!r} is a lone UTF-16 surrogate"
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None
