"""Cohesion decides a module's size; a module past 800 lines is a review flag, named with its
reason in docs/development.md ("Long modules"), so that a reviewer looks at it on purpose."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jupyter_gpushare"
DEVELOPMENT = ROOT / "docs" / "development.md"
FLAG = 800


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def flagged() -> dict[str, str]:
    """The modules docs/development.md names as long, with their reasons."""
    text = DEVELOPMENT.read_text()
    section = text.split("### Long modules", 1)[1].split("\n#", 1)[0]
    return dict(re.findall(r"^- `jupyter_gpushare/([\w/]+\.py)`: (.+)$", section, flags=re.M))


def test_a_module_past_the_flag_is_named_with_its_reason() -> None:
    long = {
        path.relative_to(PACKAGE).as_posix(): lines_of(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if lines_of(path) > FLAG
    }
    named = flagged()
    assert set(long) <= set(named), f"past {FLAG} lines, not in docs/development.md: {long}"
    # A module that shrank below the flag (or went) leaves the list, so it cannot hide a new one.
    for name in named:
        path = PACKAGE / name
        assert path.exists() and lines_of(path) > FLAG, f"{name} is no longer long: take it off the list"
