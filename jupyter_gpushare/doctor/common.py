"""The doctor's checks every kind shares: the GPU broker (through which a box sees its pool when
``broker_url`` is set) and the gpushare kernelspecs."""

from __future__ import annotations

from typing import Any

from ..config import GPUShare
from ..findings import Check, PoolSeen


def check_broker(settings: GPUShare) -> tuple[Check, dict[str, Any] | None]:
    """With ``broker_url``: the broker answers and says who it takes this user for; its pool."""
    from ..backends.transport import BrokerClient
    from ..errors import GPUShareError

    url = settings.effective_broker_url()
    client = BrokerClient(url)
    try:
        info = client.call("GET", "info")
        pool = client.call("GET", "pool")
    except GPUShareError as error:
        return (
            Check(
                "broker",
                "FAIL",
                str(error),
                "start the broker (jupyter gpushare broker, or its systemd unit / hub service), or "
                "fix c.GPUShare.broker_url",
            ),
            None,
        )
    admin = ", an admin" if info.get("admin") else ""
    found = Check(
        "broker",
        "OK",
        f"{url}: {info.get('backend')} backend ({info.get('location')}); you are {info.get('user')}{admin}",
    )
    return found, pool


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


__all__ = ["check_broker", "check_kernelspecs", "check_settings", "seen_through_the_broker"]
