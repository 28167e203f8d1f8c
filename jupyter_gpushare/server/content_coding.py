"""Whether a client takes a gzip-compressed answer, and that answer's bytes.

The pool and kernel lists grow with the node (100 slices: about 40 KiB of JSON; 1,000: 400 KiB).
They are rendered once per change and shared by every request, so they are compressed once per
change too, the first time a client that accepts gzip asks, rather than per request as tornado's
``compress_response`` would. Small bodies are sent as they are: compressing them saves nothing
a network packet would notice.
"""

from __future__ import annotations

import gzip

GZIP_MIN_BYTES = 4096  # below about three network packets, compression is not worth a header
_LEVEL = 6  # zlib's default: a 40 KiB list shrinks about tenfold in well under a millisecond


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header admits gzip (RFC 9110 §12.5.3): ``gzip`` or ``*``
    listed with a weight above zero; ``gzip;q=0`` refuses it even where ``*`` would allow it."""
    if not accept_encoding:
        return False
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, parameters = item.partition(";")
        name = coding.strip().lower()
        if not name:
            continue
        weights[name] = _weight(parameters)
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0.0


def _weight(parameters: str) -> float:
    """The ``q`` of a list item's parameters (1 when absent; 0 when it cannot be read, so a
    garbled weight never sends a client an encoding it may not decode)."""
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 0.0
            return weight if 0.0 <= weight <= 1.0 else 0.0
    return 1.0


def compressed(data: bytes) -> bytes | None:
    """``data`` gzip-compressed, or None when it is too small to be worth it."""
    if len(data) < GZIP_MIN_BYTES:
        return None
    # mtime=0: the same bytes give the same compressed bytes, so its ETag is stable too.
    return gzip.compress(data, compresslevel=_LEVEL, mtime=0)
