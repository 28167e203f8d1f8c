"""Where each ``GPUShare`` setting comes from: the layers of a process's settings, merged per
trait, and the settings a user may not override. Pure: :mod:`.loading` finds the layers.

Layers, lowest first (each setting is taken from the highest layer that sets it):

1. the traits' defaults;
2. the config files on the Jupyter config path (``jupyter_config`` then ``jupyter_server_config``,
   ``.py`` then ``.json``, in each directory), from the least specific directory to the most:
   system (``/etc/jupyter``), environment (``<sys.prefix>/etc/jupyter``), user (``~/.jupyter``),
   then ``$JUPYTER_CONFIG_PATH``'s;
3. the application's own configuration: a config file only that application reads
   (``--config``, ``jupyter_console_config.py``);
4. ``JUPYTER_GPUSHARE_<TRAIT>`` environment variables — what a spawner, a systemd unit, a test or
   ``make demo`` gives this process;
5. the command line (``--GPUShare.sample_interval=2``).

An **administrator's file** is one the user running the process can neither write nor replace
(``/etc/jupyter`` or a shared environment's ``etc/jupyter``, owned by root). A setting marked
*administered* (:data:`ADMINISTERED`: where the pool is, its limits, its queue's order) that an
administrator's file sets keeps that file's value whatever a later layer says: a user's own
``~/.jupyter/jupyter_config.py`` cannot take their kernels off the box's broker or past its
quotas. The value that lost is reported (:class:`Ignored`), never applied silently.

Where a file on the path names a GPU broker and a later layer that may override it (not an
administrator's file's) empties ``broker_url``, the process would place kernels outside the broker,
beside everyone else's: :meth:`Settled.broker_bypassed` says so, and a process refuses to start
kernels with that sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# What a person reads as where a layer's values come from, lowest precedence first.
Source = Literal[
    "system file", "environment file", "user file", "application", "environment variable", "command line"
]
SOURCES: tuple[Source, ...] = (
    "system file",
    "environment file",
    "user file",
    "application",
    "environment variable",
    "command line",
)

# Where each source of settings is (docs/admins/configuration.md tables these, in this order).
WHERE: dict[Source, str] = {
    "system file": "jupyter_config and jupyter_server_config (.py, .json) in /usr/local/etc/jupyter "
    "and /etc/jupyter: read by every Jupyter installation on the machine",
    "environment file": "the same files in <sys.prefix>/etc/jupyter: read by that Python "
    "environment only (a team box's shared installation)",
    "user file": "the same files in ~/.jupyter (JUPYTER_CONFIG_DIR) and the directories of "
    "JUPYTER_CONFIG_PATH, most specific last",
    "application": "a config file only that application reads (--config, "
    "jupyter_console_config.py, jupyter_nbconvert_config.py)",
    "environment variable": "JUPYTER_GPUSHARE_<TRAIT> in the process's environment: what a spawner, "
    "a systemd unit, a test or `make demo` gives",
    "command line": "--GPUShare.<trait>=... on the application's command line",
}

# The tag that marks an administered trait: ``Unicode(...).tag(administered=True)``.
ADMINISTERED = "administered"


@dataclass(frozen=True)
class Layer:
    """One place that sets settings: a config file, one environment variable, the application."""

    name: str  # what a person reads: "/etc/jupyter/jupyter_server_config.py", "$JUPYTER_GPUSHARE_SIMULATE"
    source: Source
    values: Mapping[str, Any]  # the GPUShare traits it sets
    administrator: bool = False  # a file the user running the process cannot change


@dataclass(frozen=True)
class Ignored:
    """A user's value of an administered setting that an administrator's file overrules."""

    trait: str
    value: Any
    layer: str  # where the ignored value was set
    kept: Any  # the administrator's value, which is used
    administrator: str  # the administrator's file

    def sentence(self) -> str:
        return (
            f"GPUShare.{self.trait} = {self.value!r} in {self.layer} is ignored: the administrator "
            f"sets it to {self.kept!r} in {self.administrator}, which a user's settings cannot override"
        )


@dataclass(frozen=True)
class Settled:
    """The merged settings, and where each came from."""

    values: dict[str, Any]
    origins: dict[str, Layer]  # trait → the layer its value came from (absent: the default)
    ignored: tuple[Ignored, ...] = ()
    layers: tuple[Layer, ...] = field(default=())  # every layer that set anything, lowest first

    def origin(self, trait: str) -> str:
        """Where ``trait``'s value came from, for a person: a file, a variable, or "default"."""
        layer = self.origins.get(trait)
        return layer.name if layer is not None else "default"

    def files(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.source.endswith("file"))

    def broker_bypassed(self) -> str | None:
        """Why this process must start no kernel, if a file on the config path names a GPU
        broker and a later layer left ``broker_url`` empty: its kernels would be placed outside the
        broker (on a private ledger, or straight on the cluster), beside everyone else's."""
        if self.values.get("broker_url"):
            return None
        named = [
            layer for layer in self.layers if layer.source.endswith("file") and layer.values.get("broker_url")
        ]
        if not named:
            return None
        emptied = self.origins.get("broker_url")
        by = emptied.name if emptied is not None else "another setting"
        return (
            f"GPUShare.broker_url = {named[-1].values['broker_url']!r} in {named[-1].name} names the "
            f"GPU broker, but {by} sets it to '': this process would place kernels outside the "
            "broker, beside everyone else's, so it starts none (remove one of the two settings)"
        )

    def summary(self) -> str:
        """One line: the files read and where each setting that is not a default came from."""
        files = ", ".join(
            f"{layer.name}{' (administrator)' if layer.administrator else ''}" for layer in self.files()
        )
        by_layer: dict[str, list[str]] = {}
        for trait, layer in self.origins.items():
            by_layer.setdefault(layer.name, []).append(trait)
        origins = "; ".join(f"{', '.join(sorted(traits))} from {name}" for name, traits in by_layer.items())
        return f"config files: {files or 'none'}; {origins or 'every GPUShare setting at its default'}"


def settle(layers: Sequence[Layer], administered: frozenset[str]) -> Settled:
    """Merge ``layers`` (lowest precedence first) per trait; an administrator's file keeps the
    traits in ``administered`` it sets against every later layer that is not an administrator's."""
    values: dict[str, Any] = {}
    origins: dict[str, Layer] = {}
    ignored: list[Ignored] = []
    for layer in layers:
        for trait, value in layer.values.items():
            holder = origins.get(trait)
            locked = (
                trait in administered
                and holder is not None
                and holder.administrator
                and not layer.administrator
            )
            if locked:
                assert holder is not None
                if value != values[trait]:
                    ignored.append(Ignored(trait, value, layer.name, values[trait], holder.name))
                continue
            values[trait] = value
            origins[trait] = layer
    return Settled(values, origins, tuple(ignored), tuple(layer for layer in layers if layer.values))


__all__ = ["ADMINISTERED", "SOURCES", "Ignored", "Layer", "Settled", "Source", "settle"]
