"""Running the broker: its backend, its routes, its Unix socket and HTTP port, its housekeeping.

Started by ``jupyter gpushare broker`` (:func:`main`). On the local backend the broker makes the
node ledger its own (files mode 0600: no user can open it, only the broker decides); on the
Kubernetes backend it holds the cluster credentials and the one list+watch (under a DRA preset
of ResourceSlices and ResourceClaims too: it creates each kernel pod's claim). Every few seconds
it releases slices of kernels that are gone and collects kernel pods nobody asks after, so a
restarted broker rebuilds its state from the ledger or the cluster and loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import grp
import logging
import os
import pwd
import signal
import stat
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tornado import web
from tornado.netutil import bind_unix_socket

from jupyter_gpushare.backends.broker_base.authority import Authority
from jupyter_gpushare.backends.broker_base.handler import BrokerState
from jupyter_gpushare.backends.broker_base.identity import HubIdentity
from jupyter_gpushare.backends.broker_base.side import Route, broker_side
from jupyter_gpushare.broker import routes, stream, usage_routes
from jupyter_gpushare.broker.banner import startup_lines, unknown_admins
from jupyter_gpushare.broker.door import BrokerServer, broker_server, raise_open_files_limit
from jupyter_gpushare.broker.settings import BrokerConfiguration, names_this_broker
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.config.broker import GPUShareBroker
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import BackendUnavailableError, ConfigurationError

log = logging.getLogger("jupyter_gpushare.broker")

PREFIX = "/api/gpushare/broker/"
SAY_AGAIN_AFTER = 60.0  # seconds before the same housekeeping problem is logged again
REQUEST_THREADS = 32  # threads for the requests' blocking calls, whatever the number of cores
HOUSEKEEPING_EVERY = 2.0  # seconds between releases of dead kernels' slices, orphan collections
# Connections the socket queues before the broker accepts them (the kernel caps it at
# net.core.somaxconn): tornado's 128 refused part of 200 servers starting kernels at once.
LISTEN_BACKLOG = 1024


def make_application(state: BrokerState, kind_routes: Sequence[Route] = ()) -> web.Application:
    every: list[Route] = [*routes.ROUTES, *usage_routes.ROUTES, *kind_routes]
    return web.Application(
        [(f"{PREFIX}{pattern}", handler, {"state": state}) for pattern, handler in every],
        # A route that is not ours answers in JSON too.
        default_handler_class=routes.NotFoundHandler,
        default_handler_args={"state": state},
        marker_ticks=stream.MarkerTicks.of(state.authority.backend),  # shared by every stream
    )


class Broker:
    """One broker process: what it holds, where it listens."""

    def __init__(
        self,
        settings: GPUShare,
        broker: GPUShareBroker,
        authority: Authority,
        configuration: BrokerConfiguration | None = None,
        kind_routes: Sequence[Route] = (),
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.authority = authority
        self.configuration = configuration
        self.kind_routes = kind_routes  # what its kind's side serves beside everyone's routes
        admins = frozenset(broker.admin_users)
        hub = HubIdentity(admins) if broker.ip else None
        self.state = BrokerState(authority, hub=hub, admin_users=admins)
        self.server: BrokerServer | None = None
        self.addresses: list[str] = []

    def listen(self) -> None:
        self.server = broker_server(
            make_application(self.state, self.kind_routes),
            self.broker.max_connections_per_user,
            self.broker.idle_timeout,
        )
        if self.broker.socket:
            path = Path(self.broker.socket)
            socket_directory(path.parent)
            sock = bind_unix_socket(str(path), mode=self.broker.socket_mode, backlog=LISTEN_BACKLOG)
            if self.broker.socket_group:
                try:
                    os.chown(path, -1, grp.getgrnam(self.broker.socket_group).gr_gid)
                except (KeyError, PermissionError) as error:
                    raise ConfigurationError(
                        f"cannot give the socket to group {self.broker.socket_group!r}: {error}"
                    ) from None
            self.server.add_socket(sock)
            self.addresses.append(f"unix:{path}")
        if self.broker.ip:
            self.server.listen(self.broker.port, self.broker.ip)
            self.addresses.append(f"http://{self.broker.ip}:{self.broker.port}/")

    async def housekeeping(self) -> None:
        said, said_at = "", 0.0  # the API's last sentence logged, and when: not one a round
        while True:
            try:
                await asyncio.to_thread(self.authority.housekeeping)
            except BackendUnavailableError as error:  # the cluster's API away: its sentence
                now = time.monotonic()
                if str(error) != said or now - said_at >= SAY_AGAIN_AFTER:
                    log.warning("GPU broker housekeeping: %s", error)
                    said, said_at = str(error), now
            except Exception:  # a busy ledger or another hiccup: next round
                log.warning("GPU broker housekeeping failed", exc_info=True)
            await asyncio.sleep(HOUSEKEEPING_EVERY)

    async def serve(self) -> None:
        # The requests' blocking calls (the ledger, the API client) wait more than they compute:
        # asyncio's default of cores + 4 threads (6 on 2 cores) queued 20 concurrent kernel pod
        # starts behind each other (benchmarks/broker_scale.py --against-plain).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="gpushare-request")
        )
        self.listen()
        backend = self.authority.backend
        for line in startup_lines(
            backend.name,
            backend.location(),
            self.addresses,
            await asyncio.to_thread(backend.pool),
            self.settings,
            self.broker,
            self.configuration,
        ):
            log.info("%s", line)
        warning = unknown_admins(self.broker, is_user)
        if warning:
            log.warning("%s", warning)
        # Everything made so far (the modules, the API client's model classes, the first view of
        # the cluster) lives as long as the broker: out of the collector's reach, so that its full
        # collections scan only what came since — they paused every thread for 70-100 ms, in the
        # middle of a burst of starts (benchmarks/broker_scale.py --against-plain).
        gc.collect()
        gc.freeze()
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopped.set)
        extra = self.start_services()
        keeper = asyncio.ensure_future(self.housekeeping())
        try:
            await stopped.wait()
        finally:
            keeper.cancel()
            for task in extra:
                task.cancel()
            self.close()

    def start_services(self) -> list[asyncio.Future[Any]]:
        starter = getattr(self.authority, "pods", None)
        return [asyncio.ensure_future(starter.run())] if starter is not None else []

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.broker.socket:
            with contextlib.suppress(OSError):
                os.unlink(self.broker.socket)
        log.info("GPU broker stopped")


def is_user(name: str) -> bool:
    """Whether ``name`` is a user of this machine (the passwd database: local, LDAP, …)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def socket_directory(directory: Path) -> None:
    """The socket's directory: made traversable by every user (0755) when the broker makes it —
    the socket's own mode and group decide who may connect — and a warning where an existing
    one lets nobody else through."""
    if not directory.exists():
        directory.mkdir(parents=True)
        # mkdir's mode is cut by the umask, which is 0077 here: the ledger's files are ours alone.
        directory.chmod(0o755)
        return
    mode = stat.S_IMODE(directory.stat().st_mode)
    if not mode & 0o011:
        log.warning(
            "the socket's directory %s is mode %04o: no other user can reach the socket through it "
            "(chmod 755 %s, or 750 and a group of its users)",
            directory,
            mode,
            directory,
        )


def run(configuration: BrokerConfiguration) -> None:
    """Build the broker for ``settings.backend`` and serve until SIGTERM/SIGINT."""
    settings, broker = configuration.settings, configuration.broker
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    logging.getLogger("tornado.access").setLevel(logging.WARNING)  # a line per request is noise
    if not broker.socket and not broker.ip:
        raise ConfigurationError(
            "the broker needs somewhere to listen: --socket PATH (a team box) or --ip IP --port N "
            "(a JupyterHub service)"
        )
    clients_url = settings.effective_broker_url()
    if clients_url and not names_this_broker(clients_url, broker):
        raise ConfigurationError(
            f"the broker holds the pool itself, but its configuration points it at another broker "
            f"({clients_url}): unset c.GPUShare.broker_url ($JUPYTER_GPUSHARE_BROKER_URL) where the "
            "broker reads it, or make it this broker's own address"
        )
    if clients_url:  # its clients' setting, naming this broker: not one of its own
        settings.broker_url = ""
        os.environ.pop(env_names.BROKER_URL, None)
        log.info("GPU broker: c.GPUShare.broker_url = %r is its clients' setting, ignored here", clients_url)
    raise_open_files_limit()  # each connection holds a file descriptor
    side = broker_side(settings)
    authority = side.authority(settings, broker)
    asyncio.run(Broker(settings, broker, authority, configuration, side.routes).serve())


__all__ = ["Broker", "make_application", "run", "socket_directory"]
