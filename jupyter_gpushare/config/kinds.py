"""The backend kinds installed: the names in the entry-point group ``jupyter_gpushare.backends``.

This package registers ``local`` and ``kubernetes`` there (pyproject.toml); another package adds a
kind by registering its own :class:`~jupyter_gpushare.backends.registry.BackendKind`. Here only the
names are read, without importing any kind, so that ``c.GPUShare.backend``, the command line's
choices and the OpenAPI document can list them; :mod:`jupyter_gpushare.backends.registry` loads
the kinds themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points

GROUP = "jupyter_gpushare.backends"
DISTRIBUTION = "jupyter-gpushare"  # this package, whose own kinds are looked up first
DEFAULT_KIND = "local"  # c.GPUShare.backend when nothing sets it


def _installed_entry_points() -> Iterable[EntryPoint]:
    return entry_points(group=GROUP)


# Where the entry points come from: importlib.metadata, or a test's own list
# (tests/toy_backend shows a third kind through a real entry point instead).
find_entry_points: Callable[[], Iterable[EntryPoint]] = _installed_entry_points


@functools.cache
def _cached_entry_points() -> tuple[EntryPoint, ...]:
    # Reading every distribution's metadata costs tens of milliseconds: once per process.
    return tuple(find_entry_points())


def kind_entry_points() -> dict[str, EntryPoint]:
    """Each installed kind's entry point by name (the first one wins where two share a name)."""
    found: dict[str, EntryPoint] = {}
    for entry_point in _cached_entry_points():
        found.setdefault(entry_point.name, entry_point)
    return found


@functools.cache
def _own_entry_points() -> dict[str, EntryPoint]:
    try:
        found = distribution(DISTRIBUTION).entry_points.select(group=GROUP)
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return {}
    return {entry_point.name: entry_point for entry_point in found}


def kind_entry_point(name: str) -> EntryPoint | None:
    """The entry point of the kind called ``name``, or None where no package registers one.

    This package's own kinds come from its own metadata, which cannot be shadowed and costs one
    distribution's read (about 2 ms); every distribution's (10-20 ms) is read only for another
    kind. Every kernel's start looks its kind up, so the difference is paid by every start.
    """
    own = _own_entry_points().get(name)
    return own if own is not None else kind_entry_points().get(name)


def kind_names() -> tuple[str, ...]:
    """The installed kinds' names, in alphabetical order."""
    return tuple(sorted(kind_entry_points()))


def forget() -> None:
    """Read the entry points again at the next question (after a package was installed)."""
    _cached_entry_points.cache_clear()
    _own_entry_points.cache_clear()


__all__ = [
    "DEFAULT_KIND",
    "DISTRIBUTION",
    "GROUP",
    "find_entry_points",
    "forget",
    "kind_entry_point",
    "kind_entry_points",
    "kind_names",
]
