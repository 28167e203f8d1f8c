"""The broker's side of the local backend: it makes the node ledger its own and serves the
slices' routes and the kernels' reports of their cells (:mod:`.slice_routes`, :mod:`.activity_routes`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from jupyter_gpushare.backends.broker_base.side import Route
from jupyter_gpushare.backends.local.backend import LocalBackend
from jupyter_gpushare.backends.local.broker import activity_routes, slice_routes
from jupyter_gpushare.backends.local.broker.authority import LocalAuthority
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.config.broker import GPUShareBroker
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import ConfigurationError

# The broker's own ledger unless configured: not root's runtime directory's, which a make demo of
# root's may have filled with a simulated pool.
BROKER_LEDGER = "/var/lib/jupyter-gpushare/ledger.sqlite"
LEDGER_FILES = ("", "-wal", "-shm", ".lock")


def secure_ledger(path: Path) -> None:
    """Make the ledger and its companion files the broker's alone (mode 0600), or refuse to run
    on one another user owns: the broker's decisions are only as good as its sole authority."""
    for suffix in LEDGER_FILES:
        target = Path(f"{path}{suffix}")
        if not target.exists():
            continue
        if target.stat().st_uid != os.geteuid():
            raise ConfigurationError(
                f"the ledger file {target} belongs to another user: the broker must own the ledger "
                "(remove it, or run the broker as its owner)"
            )
        if stat.S_IMODE(target.stat().st_mode) != 0o600:
            os.chmod(target, 0o600)


def local_authority(settings: GPUShare, broker: GPUShareBroker | None = None) -> LocalAuthority:
    # Files the ledger creates (the database, its WAL and lock) are the broker's only.
    os.umask(0o077)
    secure_ledger(settings.effective_ledger_path())
    backend = LocalBackend(settings)
    backend.ledger.change_marker()  # creates the files now, under this umask
    secure_ledger(backend.ledger.path)
    return LocalAuthority(backend, waiting_lease=(broker or GPUShareBroker()).waiting_lease)


class LocalSide:
    routes: Sequence[Route] = (*activity_routes.ROUTES, *slice_routes.ROUTES)

    def prepare(self, settings: GPUShare) -> None:
        if not settings.ledger_path and not os.environ.get(env_names.LEDGER_PATH):
            settings.ledger_path = BROKER_LEDGER

    def authority(self, settings: GPUShare, broker: GPUShareBroker) -> LocalAuthority:
        return local_authority(settings, broker)


SIDE = LocalSide()

__all__ = ["BROKER_LEDGER", "SIDE", "LocalSide", "local_authority", "secure_ledger"]
