"""The OpenAPI document a server serves: the shipped one, with the modes installed where the
server runs as the ``Mode`` schema's ``enum``.

The shipped document cannot know the modes another package adds (``jupyter_gpushare.modes``), so
its ``Mode`` is any string and names this package's in its description; what a server accepts
and answers is exact in the document it serves.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources

from jupyter_gpushare.core.modes import mode_names

MODE_SCHEMA = "\n    Mode:\n      type: string\n"  # where the enum goes, in the shipped text


def with_modes(shipped: str, modes: Iterable[str]) -> str:
    """``shipped`` with ``modes`` as the ``Mode`` schema's enum (its text otherwise unchanged)."""
    if shipped.count(MODE_SCHEMA) != 1:
        raise ValueError("openapi.yaml must have one Mode schema of type string at the top of its schemas")
    listed = ", ".join(json.dumps(name) for name in modes)  # JSON strings are YAML strings
    return shipped.replace(MODE_SCHEMA, f"{MODE_SCHEMA}      enum: [{listed}]\n")


@functools.cache
def served_document() -> str:
    """The document ``GET openapi.yaml`` answers (the installed modes do not change while a
    process runs)."""
    shipped = (resources.files("jupyter_gpushare") / "openapi.yaml").read_text()
    return with_modes(shipped, mode_names())


__all__ = ["MODE_SCHEMA", "served_document", "with_modes"]
