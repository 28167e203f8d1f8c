"""The sharing modes, by name: the entry-point group ``jupyter_gpushare.modes``.

Each mode is a :class:`~jupyter_gpushare.core.modes.base.Mode` subclass that a package registers
under the group (this package: its five, in pyproject.toml), as backend kinds are registered
(:mod:`jupyter_gpushare.config.kinds`). Every place that lists or picks a mode asks here —
``c.GPUShare.default_mode``, ``%gpu request --mode``, the commands' ``--mode``, ``GET config``
and ``GET modes``, the OpenAPI document the server serves, the Kubernetes kind's pods, claims and
node views — so a new mode is one module and one entry point (docs/development.md).

The one thing read here is the installed distributions' metadata, as an import reads files: this
package's own (about 2 ms) for its own modes, which no other package can shadow; every
distribution's (10-20 ms) once per process, only where another mode is asked for or listed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points

from jupyter_gpushare.core.errors import ConfigurationError
from jupyter_gpushare.core.modes.base import Mode

GROUP = "jupyter_gpushare.modes"
DISTRIBUTION = "jupyter-gpushare"  # this package, whose own modes are looked up first
# A mode's name becomes a DRA subrequest's and a ResourceClaimTemplate's: a DNS label.
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class UnknownModeError(ValueError):
    """A mode name that no installed package registers."""


def _installed_entry_points() -> Iterable[EntryPoint]:
    return entry_points(group=GROUP)


# Where the entry points come from: importlib.metadata, or a test's own list
# (tests/toy_mode shows a sixth mode through a real entry point instead).
find_entry_points: Callable[[], Iterable[EntryPoint]] = _installed_entry_points


@functools.cache
def _own_entry_points() -> dict[str, EntryPoint]:
    """This package's own modes."""
    try:
        found = distribution(DISTRIBUTION).entry_points.select(group=GROUP)
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return {}
    return {entry_point.name: entry_point for entry_point in found}


@functools.cache
def _every_entry_point() -> dict[str, EntryPoint]:
    # Reading every distribution's metadata costs tens of milliseconds: once per process.
    found: dict[str, EntryPoint] = {}
    for entry_point in find_entry_points():
        found.setdefault(entry_point.name, entry_point)
    return found


def mode_entry_point(name: str) -> EntryPoint | None:
    """The entry point of the mode called ``name``, or None where no package registers one."""
    own = _own_entry_points().get(name)
    return own if own is not None else _every_entry_point().get(name)


def mode_names() -> tuple[str, ...]:
    """The installed modes' names, in alphabetical order (as the backend kinds are listed)."""
    return tuple(sorted({*_own_entry_points(), *_every_entry_point()}))


_loaded: dict[str, Mode] = {}


def get_mode(name: object) -> Mode:
    """The mode called ``name`` (only its own module is imported), or one sentence naming the
    installed ones."""
    if not isinstance(name, str):
        raise UnknownModeError(f"unknown GPU mode {name!r}; choose one of: {', '.join(mode_names())}")
    mode = _loaded.get(name)
    if mode is not None:
        return mode
    entry_point = mode_entry_point(name)
    if entry_point is None:
        raise UnknownModeError(f"unknown GPU mode {name!r}; choose one of: {', '.join(mode_names())}")
    if not NAME.match(name):
        raise ConfigurationError(
            f"the mode {name!r} of {entry_point.value} cannot be used: a mode's name is lower-case "
            "letters, digits and '-', at most 63 characters, as Kubernetes names are"
        )
    found = entry_point.load()
    if not (isinstance(found, type) and issubclass(found, Mode)) or getattr(found, "name", None) != name:
        raise ConfigurationError(
            f"the entry point {name} = {entry_point.value} of group {GROUP} does not name a Mode "
            f"subclass called {name!r}"
        )
    mode = _loaded[name] = found()
    return mode


class InstalledModes(Mapping[str, Mode]):
    """The installed modes by name, in :func:`mode_names`' order; each is imported when first
    looked up, so that asking for one mode imports no other."""

    def __getitem__(self, name: str) -> Mode:
        try:
            return get_mode(name)
        except UnknownModeError:
            raise KeyError(name) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and mode_entry_point(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(mode_names())

    def __len__(self) -> int:
        return len(mode_names())

    def __repr__(self) -> str:
        return f"<the installed GPU modes: {', '.join(mode_names())}>"


MODES: Mapping[str, Mode] = InstalledModes()


def forget() -> None:
    """Find the modes again at the next question (a test that installed or removed one)."""
    _loaded.clear()
    _own_entry_points.cache_clear()
    _every_entry_point.cache_clear()


__all__ = [
    "GROUP",
    "MODES",
    "InstalledModes",
    "UnknownModeError",
    "find_entry_points",
    "forget",
    "get_mode",
    "mode_entry_point",
    "mode_names",
]
