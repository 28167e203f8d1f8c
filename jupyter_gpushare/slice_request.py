"""Turning what a kernelspec, a REST body or a magic says into a checked slice request (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidRequestError
from .modes import Mode, UnknownModeError, get_mode
from .sizes import Size, SizeError, parse_size


@dataclass(frozen=True)
class SliceRequest:
    size: Size
    mode: Mode
    cores: int | None


def make_slice_request(
    memory: object, mode: object, cores: object, default_memory: str, default_mode: str
) -> SliceRequest:
    """Validate the three request fields; ``None`` takes the configured default.

    An empty string is an error, not a default: a cleared form field or ``%gpu request ""``
    should say so rather than quietly reserve the default size.
    """
    try:
        size = parse_size(default_memory if memory is None else memory)
    except SizeError as error:
        raise InvalidRequestError(str(error)) from None
    try:
        chosen_mode = get_mode(default_mode if mode is None else mode)  # type: ignore[arg-type]
    except UnknownModeError as error:
        raise InvalidRequestError(str(error)) from None
    if chosen_mode.placement == "exclusive":
        # Exclusive means a whole card; the card is at least as large as any size that fits.
        size = parse_size("whole")
    return SliceRequest(size, chosen_mode, _check_cores(cores))


def _check_cores(cores: object) -> int | None:
    if cores is None or cores == "":
        return None
    if isinstance(cores, bool) or not isinstance(cores, (int, str)):
        raise InvalidRequestError(f"gpu_cores must be a whole percentage from 1 to 100, not {cores!r}")
    try:
        value = int(str(cores).strip().rstrip("%"))
    except ValueError:
        raise InvalidRequestError(
            f"gpu_cores must be a whole percentage from 1 to 100, not {cores!r}"
        ) from None
    if not 1 <= value <= 100:
        raise InvalidRequestError(f"gpu_cores must be from 1 to 100 (% of the GPU's SMs), not {value}")
    return value
