"""What the broker says when it starts: where it serves, what pool it holds, the limits it
decides for everyone and the configuration files they came from (pure).

An administrator starting it by hand sees at once whether their limits were read, which ledger
it holds, and whether its pool is real, simulated, or one a ledger remembers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jupyter_gpushare.broker.settings import BrokerConfiguration
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.config.broker import GPUShareBroker
from jupyter_gpushare.core.payloads import PoolPayload
from jupyter_gpushare.core.sizes import format_bytes


def startup_lines(
    backend: str,
    location: str,
    addresses: Sequence[str],
    pool: PoolPayload,
    settings: GPUShare,
    broker: GPUShareBroker,
    configuration: BrokerConfiguration | None,
) -> list[str]:
    return [
        f"GPU broker ({backend} backend, {location}) serving {', '.join(addresses)}",
        f"GPU broker pool: {pool_words(pool, settings)}",
        f"GPU broker limits: {limit_words(settings, broker)}",
        f"GPU broker configuration: {configuration_words(configuration)}",
    ]


def pool_words(pool: PoolPayload, settings: GPUShare) -> str:
    devices = pool["devices"]
    if not devices:
        return f"empty ({pool.get('problem') or 'no GPU found'})"
    names = ", ".join(
        str(device.get("node")) if device.get("node") else f"GPU{device['id']} {device['name']}"
        for device in devices
    )
    if not pool["simulated"]:
        return f"{len(devices)} device(s): {names}"
    simulate = settings.effective_simulate()
    if simulate:
        return f"{len(devices)} simulated device(s) (simulate = {simulate!r}): {names}"
    return (
        f"{len(devices)} simulated device(s) remembered by the ledger, which a process with "
        f"JUPYTER_GPUSHARE_SIMULATE registered: {names}"
    )


def limit_words(settings: GPUShare, broker: GPUShareBroker) -> str:
    def size(value: str | None) -> str:
        return "none" if value is None else value

    words = [
        f"max_memory_per_user {size(settings.max_memory_per_user)}",
        f"max_memory_per_kernel {size(settings.max_memory_per_kernel)}",
        f"overcommit {settings.overcommit:g}",
        f"when_full {settings.when_full}",
        f"queue_timeout {settings.queue_timeout:g} s",
        f"min_memory {format_bytes(settings.min_memory_bytes())}",
    ]
    admins = ", ".join(broker.admin_users) or "none besides root"
    return f"{', '.join(words)}; admin_users: {admins}"


def unknown_admins(broker: GPUShareBroker, is_user: Callable[[str], bool]) -> str | None:
    """The warning for names in ``admin_users`` that are no user of this machine (``is_user``)
    where the broker serves its Unix socket, whose callers are the machine's users: a typo would
    otherwise leave the administrator without the admin's view, and say nothing. (Over HTTP the
    callers are the hub's users, which only the hub knows.)"""
    if not broker.socket:
        return None
    unknown = [name for name in broker.admin_users if not is_user(name)]
    if not unknown:
        return None
    hub = "; over HTTP they are hub users' names, which still count" if broker.ip else ""
    return (
        f"GPUShareBroker.admin_users names no user of this machine: {', '.join(unknown)} "
        f"(on the Unix socket callers are this machine's users{hub})"
    )


def configuration_words(configuration: BrokerConfiguration | None) -> str:
    if configuration is None:
        return "given by the caller"
    if configuration.files:
        return ", ".join(str(path) for path in configuration.files)
    return (
        "no jupyter_server_config file with a GPUShare or GPUShareBroker section in "
        f"{', '.join(configuration.searched)}: the defaults above"
    )


__all__ = ["configuration_words", "limit_words", "pool_words", "startup_lines", "unknown_admins"]
