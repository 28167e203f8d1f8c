"""GPU memory sizes as users write them (docs/users/sizes.md), parsed into exact byte counts.

Pure code: no I/O. Every accepted form is binary (GiB, MiB); a bare integer is MiB because
that is the unit HAMi's ``nvidia.com/gpumem`` resource uses, so the same number means the same
thing in a kernelspec, a magic and a pod manifest.

The rules, strict on purpose so that what the picker, a magic and a REST body accept is one
thing: digits are ASCII ``0-9`` only (not ``٤`` or ``４``); whitespace around a size is ignored
(ASCII whitespace only) and none is allowed inside (``4 G`` is refused: write ``4G``); an amount
is rounded up to whole MiB (the unit of every cap and resource), and the ledger stores one
canonical spelling per size (``4096``, ``4GB`` and ``4GiB`` are all stored as ``4G``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Literal

MiB = 1024**2
GiB = 1024**3

ACCEPTED_FORMS = (
    "accepted forms: 4G, 4g, 4GB, 4GiB or 0.5G (GiB); 512M, 512MB or 512MiB (MiB); "
    "a bare integer such as 4096 (MiB); a share of the device such as 25%; "
    "or 'whole' for a whole card"
)

# A smaller share would round to nothing on any real card.
MIN_PERCENT = Decimal("0.01")

_UNITS: dict[str, int] = {
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
}

_NUMBER = r"(?P<number>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_AMOUNT = re.compile(rf"{_NUMBER}(?P<unit>[A-Za-z]*)", re.ASCII)
_PERCENT = re.compile(rf"{_NUMBER}%", re.ASCII)
# Whitespace around a size is ignored; only ASCII whitespace, as the picker's mirror does.
_SURROUNDING = " \t\n\r\f\v"


class SizeError(ValueError):
    """A size a person typed that we cannot take. Where its form is what is wrong (no number,
    an unknown unit, a space inside) the message lists the accepted forms; where the form was
    fine (zero, negative, a share above 100%) the problem says the range on its own."""

    def __init__(self, text: object, problem: str, *, forms: bool = True) -> None:
        self.text = text
        self.problem = problem
        super().__init__(f"{problem}; {ACCEPTED_FORMS}" if forms else problem)


@dataclass(frozen=True)
class Size:
    """A parsed request: an exact byte count, a percentage of a device, or a whole card."""

    form: Literal["bytes", "percent", "whole"]
    amount: Decimal  # bytes for "bytes" (whole MiB), percent (0 < p <= 100), 1 for "whole"
    text: str  # the user's spelling (trimmed), kept for messages and labels

    @property
    def canonical(self) -> str:
        """The one spelling the ledger stores: ``4G``, ``1536M``, ``12.5%`` or ``whole``."""
        if self.form == "whole":
            return "whole"
        if self.form == "percent":
            return f"{_plain(self.amount)}%"
        size_bytes = int(self.amount)
        return f"{size_bytes // GiB}G" if size_bytes % GiB == 0 else f"{size_bytes // MiB}M"

    def resolve(self, device_memory: int) -> int:
        """Bytes this size means on a device (or MIG instance) with ``device_memory`` bytes."""
        if self.form == "bytes":
            return int(self.amount)
        if self.form == "whole":
            return device_memory
        return int(Decimal(device_memory) * self.amount / 100)

    @property
    def is_whole(self) -> bool:
        return self.form == "whole"

    def __str__(self) -> str:
        return self.text


def parse_size(value: object) -> Size:
    """Read a size as docs/users/sizes.md defines it.

    ``value`` may be a string or, because JSON bodies and kernelspec configs carry numbers, an
    int (MiB). Anything else, and any zero, negative, non-numeric or unknown-unit value, raises
    :class:`SizeError` whose message lists the accepted forms.
    """
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizeError(value, f"a GPU size must be text or a whole number of MiB, not {value!r}")
    if value <= 0:
        raise SizeError(value, f"GPU size {value} must be more than zero", forms=False)
    return Size("bytes", Decimal(value * MiB), f"{value}M")


@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> Size:
    # Every placement reads its size again under the ledger's write lock, and a node sees few
    # spellings: each is read once (a refusal raises, so it is never kept).
    text = value.strip(_SURROUNDING)
    if not text:
        raise SizeError(value, "GPU size is empty")
    if text.lower() == "whole":
        return Size("whole", Decimal(1), "whole")
    if text.startswith("-"):
        raise SizeError(value, f"GPU size {text!r} must be more than zero", forms=False)

    if any(character.isspace() for character in text):
        raise SizeError(value, f"GPU size {text!r} has a space inside; write it without, e.g. 4G")
    if any(character.isdecimal() and character not in "0123456789" for character in text):
        raise SizeError(value, f"GPU size {text!r} has a digit that is not 0-9")
    percent = _PERCENT.fullmatch(text)
    if percent:
        share = _decimal(percent["number"], value)
        if share < MIN_PERCENT or share > 100:
            raise SizeError(value, f"GPU share {text!r} must be from {MIN_PERCENT}% to 100%", forms=False)
        return Size("percent", share, text)

    amount = _AMOUNT.fullmatch(text)
    if not amount:
        raise SizeError(value, f"cannot read GPU size {text!r}")
    number = _decimal(amount["number"], value)
    unit = amount["unit"].lower()
    if unit == "":
        if number != number.to_integral_value():
            raise SizeError(value, f"a bare number is MiB and must be whole: {text!r}")
        scale = MiB
    elif unit in _UNITS:
        scale = _UNITS[unit]
    else:
        raise SizeError(value, f"unknown unit {amount['unit']!r} in GPU size {text!r}")
    if number * scale <= 0:
        raise SizeError(value, f"GPU size {text!r} must be more than zero", forms=False)
    # Whole MiB, rounded up: never less than asked, and what every cap and resource counts in.
    size_bytes = to_mib(int((number * scale).to_integral_value(rounding=ROUND_CEILING))) * MiB
    return Size("bytes", Decimal(size_bytes), text)


def _plain(number: Decimal) -> str:
    """A decimal without exponent or trailing zeros: ``12.5``, ``25``, ``0.01``."""
    text = format(number.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _decimal(number: str, original: object) -> Decimal:
    try:
        return Decimal(number)
    except InvalidOperation as error:  # the regexes make this unreachable; kept for safety
        raise SizeError(original, f"cannot read GPU size {original!r}") from error


def format_bytes(size_bytes: int) -> str:
    """Short human form in the units users type: ``7.5G``, ``512M``, ``80G``."""
    if size_bytes >= GiB:
        gib = size_bytes / GiB
        return f"{gib:.0f}G" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f}G"
    mib = size_bytes / MiB
    return f"{mib:.0f}M" if abs(mib - round(mib)) < 0.5 else f"{mib:.1f}M"


def to_mib(size_bytes: int) -> int:
    """Whole MiB, rounded up so a cap in MiB never undercuts the bytes reserved."""
    return -(-size_bytes // MiB)


def bytes_or_none(size: str | None) -> int | None:
    """Bytes of an amount such as a quota (``"16G"``), None for no size (no limit)."""
    return None if size is None else parse_size(size).resolve(0)
