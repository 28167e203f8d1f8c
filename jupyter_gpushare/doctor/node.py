"""The doctor's checks of a GPU node: its GPUs (or the pool the ledger or the broker knows), the
sharing modes it can honour, the ledger, the broker, the kernelspecs.

A line appears where it matters to this box: the MIG, MPS and HAMi-core lines only where the
feature is there, configured, or the default mode needs it; otherwise one line says which modes
the node offers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from ..config import GPUShare
from ..devices import Device, Inventory
from ..inventory import discover
from ..modes import MODES, NodeFacts, probe_node
from .checks import Check, Findings

GPU_NODE_DOCS = "docs/admins/gpu-node.md"


@dataclasses.dataclass(frozen=True)
class PoolSeen:
    """The devices kernels would be placed on, and where the doctor learnt of them."""

    devices: tuple[str, ...]  # "GPU0 Simulated A100-80GB"
    simulated: bool
    source: str  # "NVML", "simulated", "the ledger", "the broker"
    mig_instances: int = 0
    problem: str | None = None  # why there is none


def seen_locally(settings: GPUShare, inventory: Inventory) -> PoolSeen:
    """This process's GPUs (NVML or a simulation) or, without any, the pool the ledger remembers
    (what ``status`` and kernels then use: after ``make demo``, its simulated pool)."""
    if inventory.devices:
        return PoolSeen(
            _labels(inventory.devices),
            inventory.simulated,
            "simulated" if inventory.simulated else "NVML",
            sum(len(device.mig) for device in inventory.devices),
        )
    remembered, simulated = _remembered(settings)
    if remembered:
        return PoolSeen(_labels(remembered), simulated, "the ledger", sum(len(d.mig) for d in remembered))
    return PoolSeen((), False, "NVML", problem=inventory.problem or "no GPU found")


def _remembered(settings: GPUShare) -> tuple[list[Device], bool]:
    from ..ledger import Ledger

    path = settings.effective_ledger_path()
    if not path.exists():
        return [], False
    try:
        ledger = Ledger(path)
        return ledger.devices(), ledger.simulated()
    except Exception:  # the ledger check says what is wrong with it
        return [], False


def _labels(devices: Sequence[Device]) -> tuple[str, ...]:
    return tuple(f"{device.label} {device.name}" for device in devices)


def check_gpus(pool: PoolSeen, driver: str = "?") -> Check:
    names = ", ".join(pool.devices)
    if not pool.devices:
        return Check(
            "GPUs",
            "FAIL",
            pool.problem or "no GPU found",
            "install the NVIDIA driver (nvidia-smi must work), or set "
            "JUPYTER_GPUSHARE_SIMULATE=1xA100-80GB to try gpushare without a GPU",
        )
    if pool.source == "the broker":
        kind = "simulated pool served" if pool.simulated else "served"
        return Check(
            "GPUs",
            "WARN" if pool.simulated else "OK",
            f"{kind} by the broker: {names}",
            "the broker runs with JUPYTER_GPUSHARE_SIMULATE: unset it where it runs on a GPU node",
        )
    if pool.simulated and pool.source == "the ledger":
        return Check(
            "GPUs",
            "WARN",
            f"simulated pool remembered by the ledger ({names}); no real GPU is used",
            "a process with JUPYTER_GPUSHARE_SIMULATE (make demo) registered it; on a GPU node, "
            "a server without it registers the real cards instead",
        )
    if pool.simulated:
        return Check(
            "GPUs",
            "WARN",
            f"simulated pool ({names}); no real GPU is used",
            "unset c.GPUShare.simulate / JUPYTER_GPUSHARE_SIMULATE on a GPU node",
        )
    if pool.source == "the ledger":
        return Check("GPUs", "OK", f"{len(pool.devices)} remembered by the ledger: {names}")
    return Check("GPUs", "OK", f"{len(pool.devices)} via NVML (driver {driver}): {names}")


def node_facts(settings: GPUShare, inventory: Inventory, pool: PoolSeen) -> NodeFacts:
    facts = probe_node(
        inventory, libvgpu_path=settings.libvgpu_path, mps_pipe_directory=settings.mps_pipe_directory
    )
    if not inventory.devices and pool.devices:  # the ledger's pool
        facts = dataclasses.replace(
            facts, simulated=pool.simulated, has_devices=True, mig_instances=pool.mig_instances
        )
    return facts


def check_modes(settings: GPUShare, facts: NodeFacts) -> Check:
    """Which sharing modes the node offers; a FAIL only when the default mode is not one."""
    reasons = {name: mode.unavailable_reason(facts) for name, mode in MODES.items()}
    offered = [name for name, reason in reasons.items() if reason is None]
    default = settings.default_mode
    if reasons[default] is not None:
        return Check(
            "modes",
            "FAIL",
            f"the default mode {default!r} is not available here: {reasons[default]}",
            f"set up {default} ({GPU_NODE_DOCS}), or choose another c.GPUShare.default_mode "
            f"(available: {', '.join(offered) or 'none'})",
        )
    missing = [name for name, reason in reasons.items() if reason is not None]
    later = f"; not set up here: {', '.join(missing)} ({GPU_NODE_DOCS})" if missing else ""
    return Check("modes", "OK", f"{', '.join(offered)} (default {default}){later}")


def relevant_mode_checks(settings: GPUShare, inventory: Inventory, facts: NodeFacts) -> list[Check]:
    """The MIG, MPS and HAMi-core lines of a box where they matter: present, configured, or the
    default mode's."""
    checks = []
    if facts.mig_instances or settings.default_mode == "mig":
        checks.append(check_mig(inventory))
    if facts.mps_pipe_directory or settings.mps_pipe_directory or settings.default_mode == "mps":
        checks.append(check_mps(settings, inventory))
    if settings.libvgpu_path or settings.default_mode == "vgpu":
        checks.append(check_vgpu(settings))
    return checks


def check_mig(inventory: Inventory) -> Check:
    instances = [(device.label, instance.profile) for device in inventory.devices for instance in device.mig]
    if instances:
        return Check(
            "MIG", "OK", f"{len(instances)} instance(s): " + ", ".join(f"{d} {p}" for d, p in instances)
        )
    return Check(
        "MIG",
        "WARN",
        "no MIG instances: mode 'mig' is unavailable",
        "on A100/H100: nvidia-smi -i 0 -mig 1, then nvidia-smi mig -cgi 1g.10gb -C",
    )


def check_mps(settings: GPUShare, inventory: Inventory) -> Check:
    facts = probe_node(inventory, mps_pipe_directory=settings.mps_pipe_directory)
    if facts.mps_pipe_directory:
        return Check("MPS", "OK", f"control daemon answering in {facts.mps_pipe_directory}")
    return Check(
        "MPS",
        "WARN",
        "no MPS control daemon: mode 'mps' is unavailable",
        "start it with nvidia-cuda-mps-control -d (or set c.GPUShare.mps_pipe_directory)",
    )


def check_vgpu(settings: GPUShare) -> Check:
    path = settings.libvgpu_path
    if not path:
        return Check(
            "HAMi-core",
            "WARN",
            "c.GPUShare.libvgpu_path is not set: mode 'vgpu' is unavailable locally",
            "build HAMi-core and set c.GPUShare.libvgpu_path to libvgpu.so",
        )
    if not os.path.isfile(path):
        return Check("HAMi-core", "FAIL", f"{path} does not exist", "fix c.GPUShare.libvgpu_path")
    return Check("HAMi-core", "OK", f"{path}")


def check_ledger(settings: GPUShare) -> Check:
    from ..ledger import Ledger

    path = settings.effective_ledger_path()
    try:
        ledger = Ledger(path)
        records = ledger.records()
    except Exception as error:  # any sqlite or filesystem problem is the finding
        return Check(
            "ledger",
            "FAIL",
            f"{path}: {error}",
            "point c.GPUShare.ledger_path at a writable local (not NFS) directory",
        )
    return Check("ledger", "OK", f"{path} ({len(records)} slice(s) or queued request(s))")


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


def local_checks(settings: GPUShare, inventory: Inventory | None) -> Findings:
    """The local kind's checks (its ``doctor_checks``): the node's GPUs or the pool its ledger
    remembers, the sharing modes, the ledger."""
    inventory = inventory if inventory is not None else discover(settings.effective_simulate())
    pool = seen_locally(settings, inventory)
    facts = node_facts(settings, inventory, pool)
    checks = [
        check_gpus(pool, inventory.details.get("driver", "?")),
        *([check_modes(settings, facts)] if pool.devices else []),
        *relevant_mode_checks(settings, inventory, facts),
        check_ledger(settings),
    ]
    return Findings(checks, ready=bool(pool.devices), simulated=pool.simulated)


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
