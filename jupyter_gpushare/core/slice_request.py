"""Turning what a kernelspec, a REST body or a magic says into a checked slice request (pure)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.modes import Mode, UnknownModeError, get_mode
from jupyter_gpushare.core.sizes import Size, SizeError, format_bytes, parse_size

MAX_PATH_BYTES = 4096  # a notebook path, in UTF-8 (PATH_MAX on Linux)
MAX_NAME_BYTES = 255  # a kernelspec name
CORES = re.compile(r"[0-9]+%?")  # as openapi.yaml says (ASCII digits: int() takes any script's)
SURROUNDING = " \t\n\r\f\v"  # ignored around a number, as around a size (ASCII only)


@dataclass(frozen=True)
class SliceRequest:
    size: Size
    mode: Mode
    cores: int | None
    # Exclusive requests become "whole"; the amount asked stays as the least memory the card
    # must have (the local allocator and a DRA claim's CEL pick such a card; device plugins
    # cannot say it).
    card: Size | None = None

    @property
    def card_at_least(self) -> int | None:
        """Bytes an exclusive request's card must have at least (None: any card)."""
        return self.card.resolve(0) if self.card is not None else None


def make_slice_request(
    memory: object,
    mode: object,
    cores: object,
    default_memory: str,
    default_mode: str,
    min_memory: int = 0,
) -> SliceRequest:
    """Validate the three request fields; ``None`` takes the configured default.

    An empty string is an error, not a default: a cleared form field or ``%gpu request ""``
    should say so rather than quietly reserve the default size. An amount below ``min_memory``
    bytes (``GPUShare.min_memory``) is refused; a share is checked where it lands.
    """
    chosen = default_memory if memory is None else memory
    try:
        size = parse_size(chosen)
    except SizeError as error:
        raise InvalidRequestError(str(error)) from None
    if size.form == "bytes" and size.resolve(0) < min_memory:
        raise InvalidRequestError(
            f"a GPU slice must be at least {format_bytes(min_memory)} (GPUShare.min_memory), "
            f"not {chosen}: a CUDA context alone needs about that much"
        )
    try:
        chosen_mode = get_mode(default_mode if mode is None else mode)  # type: ignore[arg-type]
    except UnknownModeError as error:
        raise InvalidRequestError(str(error)) from None
    card = None
    if chosen_mode.placement == "exclusive":
        # Exclusive means a whole card; the card is at least as large as any size that fits.
        card = size if size.form == "bytes" else None
        size = parse_size("whole")
    return SliceRequest(size, chosen_mode, _check_cores(cores), card)


def _check_cores(cores: object) -> int | None:
    if cores is None or cores == "":
        return None
    if isinstance(cores, bool) or not isinstance(cores, (int, str)):
        raise InvalidRequestError(f"gpu_cores must be a whole percentage from 1 to 100, not {cores!r}")
    text = cores.strip(SURROUNDING) if isinstance(cores, str) else str(cores)
    if not CORES.fullmatch(text):
        raise InvalidRequestError(
            f"gpu_cores must be a whole percentage from 1 to 100 in the digits 0-9, such as 50 or "
            f"50%, not {cores!r}"
        )
    value = int(text.removesuffix("%"))
    if not 1 <= value <= 100:
        raise InvalidRequestError(f"gpu_cores must be from 1 to 100 (% of the GPU's SMs), not {value}")
    return value


def stored_label(text: str, max_bytes: int) -> str:
    """A kernel name or path as the ledger stores it and every client shows it: control
    characters and lone surrogates replaced, cut to ``max_bytes`` of UTF-8.

    The REST API refuses such values outright; names and paths that arrive another way (a
    session's name through ``/api/kernels``) are made harmless here.
    """
    cleaned = "".join("\ufffd" if unicodedata.category(char) in ("Cc", "Cs") else char for char in text)
    encoded = cleaned.encode("utf-8")
    return encoded[:max_bytes].decode("utf-8", "ignore") if len(encoded) > max_bytes else cleaned
