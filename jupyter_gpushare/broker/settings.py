"""The broker's own traits, ``c.GPUShareBroker.<trait>``, and where the broker finds its settings.

The broker reads the ``GPUShare`` and ``GPUShareBroker`` sections of the ``jupyter_server_config``
files in its own configuration directory (``/etc/jupyter-gpushare``, ``--config-dir``) and on its
Jupyter config path, the first winning; then ``JUPYTER_GPUSHARE_<TRAIT>`` variables; the
command's flags (``--socket``, ``--ip``, ``--port``, ``--backend``) win over all. Root's own
Jupyter settings must not decide for a team box: its ledger is the broker's own
(``/var/lib/jupyter-gpushare/ledger.sqlite`` unless configured), never the runtime directory's
ledger a ``make demo`` of root's may have left with a simulated pool in it.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_config_path
from traitlets import Float, Integer, List, TraitError, Unicode, validate
from traitlets.config import Config, Configurable

from .. import env_names
from ..config import GPUShare, load_settings, read_config_files
from ..errors import ConfigurationError

BROKER_CONFIG_DIR = "/etc/jupyter-gpushare"
BROKER_LEDGER = "/var/lib/jupyter-gpushare/ledger.sqlite"
SECTIONS = ("GPUShare", "GPUShareBroker")


class GPUShareBroker(Configurable):
    """Where the GPU broker listens, and who may see everything."""

    socket = Unicode(
        "",
        config=True,
        help="Unix socket to serve on (a team box), e.g. /run/jupyter-gpushare/broker.sock. Callers "
        "are identified by the socket's peer credentials. Clients set "
        "c.GPUShare.broker_url = 'unix:<this path>'.",
    )
    socket_mode = Integer(
        0o666,
        config=True,
        help="Permissions of the socket file. The default lets every local user connect (each is "
        "still only themselves); 0o660 with socket_group limits the broker to one group.",
    )
    socket_group = Unicode(
        "", config=True, help="Group that owns the socket file (with socket_mode 0o660: its members only)."
    )
    ip = Unicode(
        "",
        config=True,
        help="Address to serve HTTP on (a cluster: the broker as a JupyterHub service), e.g. "
        "0.0.0.0. Callers present a JupyterHub API token, checked with the hub. Empty: no HTTP.",
    )
    port = Integer(8765, config=True, help="Port of the HTTP service (with ip).")
    admin_users = List(
        Unicode(),
        config=True,
        help="Users who see and act on every user's kernels, besides root and the broker's own "
        "user (socket) and hub admins (HTTP).",
    )
    orphan_grace = Float(
        30.0,
        config=True,
        help="Kubernetes: seconds a kernel pod may go without its server asking after it (servers "
        "ask every few seconds) before the broker deletes it and its Secret: the pods of a server "
        "that is gone, and of a start the broker was killed in.",
    )

    @validate("socket_mode")
    def _check_mode(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if not 0 <= value <= 0o777:
            raise TraitError(f"GPUShareBroker.socket_mode must be a file mode such as 0o660, not {value!r}")
        return value

    @validate("port")
    def _check_port(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if not 0 < value < 65536:
            raise TraitError(f"GPUShareBroker.port must be from 1 to 65535, not {value}")
        return value

    @validate("orphan_grace")
    def _check_grace(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if value < 0:
            raise TraitError("GPUShareBroker.orphan_grace must not be negative")
        return value


def names_this_broker(url: str, broker: GPUShareBroker) -> bool:
    """Whether the clients' ``broker_url`` is this broker's own address: its socket, or its
    HTTP port. Read from the files every user reads (``/etc/jupyter``) or from
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
    searched = (config_dir, *jupyter_config_path())
    config, files = read_config_files(SECTIONS, list(searched))
    settings = load_settings(Config({"GPUShare": dict(config.get("GPUShare", {}))}))
    if backend:
        settings.backend = backend
    if settings.backend == "local" and not settings.ledger_path and not os.environ.get(env_names.LEDGER_PATH):
        settings.ledger_path = BROKER_LEDGER
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
    "BROKER_LEDGER",
    "BrokerConfiguration",
    "GPUShareBroker",
    "load_broker_configuration",
    "load_broker_settings",
]
