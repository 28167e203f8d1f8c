"""Text for a terminal: what the command line prints, made harmless (pure).

A table shows what many hands wrote — kernel ids, notebook paths, user and device names, a
broker's or a cluster's messages. Printed raw, a control character in any of them is an
instruction to the terminal of whoever reads it (root's, for ``jupyter gpushare status``): an
escape sequence can retitle the window, clear the screen or hide lines, a bidirectional override
can make text read backwards. :func:`printable` shows each such character as its escape instead.
"""

from __future__ import annotations

import unicodedata

# Characters that reorder the text around them (Unicode's bidirectional embeddings, overrides and
# isolates): not control characters by category, but they change what a reader sees.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """``text`` with every control character but the newline written as its escape (``\\x1b``,
    ``\\u202e``), and lone surrogates (which no terminal encoding can carry) likewise."""
    return "".join(_shown(char) for char in text)


def _shown(char: str) -> str:
    if char == "\n":
        return char
    if char in BIDI_CONTROLS or unicodedata.category(char) in ("Cc", "Cs"):
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


__all__ = ["printable"]
