"""Reading a REST body without trusting it: limits first, then JSON, then text checks (pure).

The handlers call :func:`json_object` before they look at a single field. Everything here is
checked *before* the part that could cost too much: the size before parsing, the nesting before
the recursive parser (which raises ``RecursionError`` around 1,000 levels), and the strings
before any of them reaches sqlite or a client (a lone surrogate cannot be stored as UTF-8).
Every refusal is a :class:`~jupyter_gpushare.errors.RequestBodyError` (400) that says which
limit was broken; nothing was changed.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from typing import Any

from ..errors import RequestBodyError
from ..slice_request import MAX_NAME_BYTES, MAX_PATH_BYTES

__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "check_label", "json_object", "json_value"]

MAX_BODY_BYTES = 64 * 1024  # the largest body any route needs is a few hundred bytes
MAX_NESTING = 32  # levels of arrays and objects; our bodies are flat

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")
_DEPTH_CHANGE = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, without parsing it."""
    outside_strings = _STRINGS.sub(b"", raw)
    changes = (_DEPTH_CHANGE[match[0]] for match in _BRACKETS.findall(outside_strings))
    return max(itertools.accumulate(changes, initial=0))


def json_value(raw: bytes, max_bytes: int = MAX_BODY_BYTES, max_nesting: int = MAX_NESTING) -> Any:
    """A body as JSON, refused with a 400 when it is too large, too deep or not text."""
    if len(raw) > max_bytes:
        raise RequestBodyError(
            f"the request body is {len(raw)} bytes; at most {max_bytes} bytes are accepted"
        )
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
        raise RequestBodyError(f"{name} must be a string, not {json.dumps(value)}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise RequestBodyError(f"{name} is {size} bytes long; at most {max_bytes} bytes are accepted")
    control = next((char for char in value if unicodedata.category(char) == "Cc"), None)
    if control is not None:
        raise RequestBodyError(f"{name} must not contain control characters such as {control!r}")
    return value


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
