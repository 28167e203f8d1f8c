"""The broker's own traits, ``c.GPUShareBroker.<trait>``, and where the broker finds its settings.

The broker reads the ``GPUShare`` and ``GPUShareBroker`` sections of the config files on its
Jupyter config path and in its own configuration directory (``/etc/jupyter-gpushare``,
``--config-dir``), which wins over them, merged per trait over the ``JUPYTER_GPUSHARE_<TRAIT>``
variables, as every process does (:mod:`jupyter_gpushare.config.layers`); the command's flags
(``--socket``, ``--ip``, ``--port``, ``--backend``) win over all. Root's own
Jupyter settings must not decide for a team box: its ledger is the broker's own
(``/var/lib/jupyter-gpushare/ledger.sqlite`` unless configured: the local kind's broker side
settles it), never the runtime directory's
ledger a ``make demo`` of root's may have left with a simulated pool in it.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpushare.backends.broker_base.side import broker_side
from jupyter_gpushare.config import GPUShare, load_settings
from jupyter_gpushare.config.broker import GPUShareBroker
from jupyter_gpushare.config.layers import Source
from jupyter_gpushare.config.loading import config_directories, config_files
from jupyter_gpushare.core.errors import ConfigurationError

BROKER_CONFIG_DIR = "/etc/jupyter-gpushare"
SECTIONS = ("GPUShare", "GPUShareBroker")


def names_this_broker(url: str, broker: GPUShareBroker) -> bool:
    """Whether the clients' ``broker_url`` is this broker's own address: its socket, or its
    HTTP port. Read from the files every user reads (``/etc/jupyter``, the shared
    installation's ``etc/jupyter``) or from
    ``/etc/environment``, it reaches the broker too, and is no setting of the broker's."""
    if url.startswith("unix:"):
        return bool(broker.socket) and os.path.realpath(url.removeprefix("unix:")) == os.path.realpath(
            broker.socket
        )
    port = urllib.parse.urlsplit(url).port
    return bool(broker.ip) and (port or 80) == broker.port


@dataclass(frozen=True)
class BrokerConfiguration:
    """What the broker runs with, and the files that said so (for its startup lines)."""

    settings: GPUShare
    broker: GPUShareBroker
    files: tuple[Path, ...]  # the config files that had a GPUShare or GPUShareBroker section
    searched: tuple[str, ...]  # the directories looked in, its own first


def load_broker_configuration(
    config_dir: str = BROKER_CONFIG_DIR,
    overrides: dict[str, Any] | None = None,
    backend: str | None = None,
) -> BrokerConfiguration:
    """The broker's settings: its configuration directory's files, then those of the Jupyter
    config path, the environment, and ``overrides`` (the command's flags)."""
    own: list[tuple[str, Source]] = [(config_dir, "system file")] if config_dir else []
    found = config_files(own)  # least specific first
    config = Config()
    for _, _, loaded in found:
        config.merge(Config({section: loaded[section] for section in SECTIONS if section in loaded}))
    files = [path for path, _, loaded in reversed(found) if any(section in loaded for section in SECTIONS)]
    searched = tuple(directory for directory, _ in reversed(config_directories(own)))
    settings = load_settings(directories=own)
    if backend:
        settings.backend = backend
    broker_side(settings).prepare(settings)
    return BrokerConfiguration(settings, load_broker_settings(config, overrides), tuple(files), searched)


def load_broker_settings(
    config: Config | None = None, overrides: dict[str, Any] | None = None
) -> GPUShareBroker:
    """The broker's traits from ``config`` (the config files'), then ``overrides``."""
    merged = Config(config or {})
    for name, value in (overrides or {}).items():
        if value is not None:
            merged.GPUShareBroker[name] = value
    try:
        return GPUShareBroker(config=merged)
    except (TraitError, ValueError) as error:
        raise ConfigurationError(f"invalid GPUShareBroker configuration: {error}") from None


__all__ = [
    "BROKER_CONFIG_DIR",
    "BrokerConfiguration",
    "GPUShareBroker",
    "load_broker_configuration",
    "load_broker_settings",
]
