"""The broker's own traits, ``c.GPUShareBroker.<trait>`` (where it reads them:
:mod:`jupyter_gpushare.broker.settings`); here, below the kinds, for what a kind's side reads of
them (its waiting lease, its orphans' grace)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Float, Integer, List, TraitError, Unicode, validate
from traitlets.config import Configurable

ACCOUNTING_FILENAME = "gpushare-broker-accounting.sqlite"


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
        "user (socket) and hub admins (HTTP). On the Unix socket callers are the machine's users: "
        "a name that is no user of the machine is warned of when the broker starts.",
    )
    orphan_grace = Float(
        30.0,
        config=True,
        help="Kubernetes: seconds a kernel pod may go without its server asking after it (servers "
        "ask every few seconds) before the broker deletes it and its Secret: the pods of a server "
        "that is gone, and of a start the broker was killed in.",
    )
    accounting_path = Unicode(
        "",
        config=True,
        help="Kubernetes: the broker's accounting file (sqlite, mode 0600: what every user's kernel "
        "pods reserved, used and waited, behind GET usage, `jupyter gpushare report` and the "
        "Prometheus counters). Put it on a volume that outlives the broker's pod. Default: "
        f"{ACCOUNTING_FILENAME} in the Jupyter runtime dir. (The local backend keeps its accounting "
        "in the node ledger.)",
    )
    max_connections_per_user = Integer(
        64,
        config=True,
        help="Connections one OS user may hold open to the broker's Unix socket at once (each "
        "costs the broker a file descriptor); one more is answered 503 and closed. A server holds "
        "one for its event stream and opens one per call.",
    )
    idle_timeout = Float(
        60.0,
        config=True,
        help="Seconds a connection may wait without sending a complete request before the broker "
        "closes it (a running event stream is not idle).",
    )
    waiting_lease = Float(
        20.0,
        config=True,
        help="Seconds a start waiting in the queue may go without its requester asking after it "
        "(clients ask every few seconds, again after a broker restart) before the broker drops "
        "it: a request nobody waits for must not hold up the queue.",
    )

    def effective_accounting_path(self) -> Path:
        return (
            Path(self.accounting_path).expanduser()
            if self.accounting_path
            else (Path(jupyter_runtime_dir()) / ACCOUNTING_FILENAME)
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

    @validate("max_connections_per_user")
    def _check_connections(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if value < 1:
            raise TraitError(f"GPUShareBroker.max_connections_per_user must be at least 1, not {value}")
        return value

    @validate("idle_timeout", "waiting_lease")
    def _check_positive(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not value > 0:
            raise TraitError(f"GPUShareBroker.{proposal['trait'].name} must be more than 0 seconds")
        return value


__all__ = ["GPUShareBroker"]
