"""The doctor's checks every kind shares: the GPU broker (through which a box sees its pool when
``broker_url`` is set) and the gpushare kernelspecs."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.findings import Check, PoolSeen

if TYPE_CHECKING:
    from jupyter_gpushare.backends.broker_client.transport import SocketRefusal


START_THE_BROKER = (
    "start the broker (jupyter gpushare broker, or its systemd unit / hub service), or fix "
    "c.GPUShare.broker_url"
)


def check_broker(settings: GPUShare) -> tuple[Check, dict[str, Any] | None]:
    """With ``broker_url``: the broker answers and says who it takes this user for; its pool."""
    from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
    from jupyter_gpushare.core.errors import GPUShareError

    url = settings.effective_broker_url()
    client = BrokerClient(url)
    try:
        info = client.call("GET", "info")
        pool = client.call("GET", "pool")
    except GPUShareError as error:
        path = client.address.socket_path
        fix = unreachable_fix(path) if path and isinstance(error, UnreachableError) else START_THE_BROKER
        return Check("broker", "FAIL", str(error), fix), None
    admin = ", an admin" if info.get("admin") else ""
    found = Check(
        "broker",
        "OK",
        f"{url}: {info.get('backend')} backend ({info.get('location')}); you are {info.get('user')}{admin}",
    )
    return found, pool


def unreachable_fix(path: str) -> str:
    """The fix for a broker whose socket at ``path`` does not answer: a broker that is not
    running is started; one this user may not reach is the administrator's to open to them."""
    from jupyter_gpushare.backends.broker_client.transport import refusal_on_the_way

    refusal = refusal_on_the_way(path)
    if refusal is None:
        if _nothing_listens(path):
            return f"nothing listens on {path}: the broker is not running; {START_THE_BROKER}"
        return START_THE_BROKER
    if not refusal.denied:
        return START_THE_BROKER
    where = f"permission denied on {refusal.path} ({refusal.attributes()})"
    return f"the broker may well be running, but you may not reach it: {where}; {_ask(refusal)}"


def _ask(refusal: SocketRefusal) -> str:
    """Who can let this user through, and how."""
    if refusal.group_may:
        if _member_of(refusal.group):
            return (
                f"you are in group {refusal.group}, but this session started before you were: "
                f"log out and in again (or run newgrp {refusal.group})"
            )
        return f"ask the administrator to add you to group {refusal.group} (then log in again)"
    if refusal.directory:
        return (
            f"its mode lets only {refusal.owner} through: ask the administrator to chmod 755 "
            f"{refusal.path} (or 750 and a group of its users)"
        )
    return (
        "ask the administrator to let you connect (c.GPUShareBroker.socket_mode 0o666, or 0o660 "
        "with a socket_group you are in)"
    )


def _member_of(group: str) -> bool:
    """Whether this user is in ``group`` as the system's group database says (whatever groups
    this process was started with)."""
    import grp
    import pwd

    try:
        entry = grp.getgrnam(group)
        me = pwd.getpwuid(os.getuid())
    except KeyError:
        return False
    return me.pw_name in entry.gr_mem or me.pw_gid == entry.gr_gid


def _nothing_listens(path: str) -> bool:
    """Whether a socket file is there with no process listening on it (a broker that stopped
    without removing it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def seen_through_the_broker(pool: dict[str, Any] | None) -> PoolSeen:
    devices = (pool or {}).get("devices") or []
    labels = tuple(
        f"{device['node']}" if device.get("node") else f"GPU{device['id']} {device['name']}"
        for device in devices
    )
    problem = (pool or {}).get("problem") or "the broker's pool has no device"
    return PoolSeen(labels, bool((pool or {}).get("simulated")), "the broker", problem=problem)


def check_settings(settings: GPUShare) -> Check:
    """Which config files were read and where each setting came from; a user's setting that an
    administrator's file overrules."""
    settled = settings.settled
    if settled is None:
        return Check("settings", "OK", "given by the caller")
    bypassed = settled.broker_bypassed()
    if bypassed:
        return Check(
            "settings",
            "FAIL",
            bypassed,
            "use the GPU broker (remove the empty broker_url), or remove the broker from the file",
        )
    if settled.ignored:
        return Check(
            "settings",
            "WARN",
            "; ".join(ignored.sentence() for ignored in settled.ignored),
            "remove those lines from your own configuration (the administrator's value is used "
            "either way), or ask the administrator to change theirs",
        )
    return Check("settings", "OK", settled.summary())


def check_kernelspecs() -> Check:
    from jupyter_client.kernelspec import KernelSpecManager

    names = []
    for name, entry in KernelSpecManager().get_all_specs().items():
        metadata = (entry.get("spec") or {}).get("metadata") or {}
        if (metadata.get("kernel_provisioner") or {}).get("provisioner_name") == "gpushare-provisioner":
            names.append(name)
    if names:
        return Check("kernelspecs", "OK", ", ".join(sorted(names)))
    return Check(
        "kernelspecs",
        "WARN",
        "no gpushare kernelspec is installed",
        "jupyter gpushare kernelspec install --sys-prefix",
    )


__all__ = [
    "check_broker",
    "check_kernelspecs",
    "check_settings",
    "seen_through_the_broker",
    "unreachable_fix",
]
