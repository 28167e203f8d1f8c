"""The local kind's doctor checks (its ``doctor_checks``): the node's GPUs or the pool its ledger
remembers, the sharing modes it can honour, the ledger.

A line appears where it matters to this box: the MIG, MPS and HAMi-core lines only where the
feature is there, configured, or the default mode needs it; otherwise one line says which modes
the node offers.
"""

from __future__ import annotations

import dataclasses
import os

from jupyter_gpushare.backends.local.inventory import discover
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.devices import Device, Inventory
from jupyter_gpushare.core.findings import Check, Findings, PoolSeen, check_gpus, device_labels
from jupyter_gpushare.core.modes import MODES, NodeFacts, probe_node

GPU_NODE_DOCS = "docs/admins/gpu-node.md"


def seen_locally(settings: GPUShare, inventory: Inventory) -> PoolSeen:
    """This process's GPUs (NVML or a simulation) or, without any, the pool the ledger remembers
    (what ``status`` and kernels then use: after ``make demo``, its simulated pool)."""
    if inventory.devices:
        return PoolSeen(
            device_labels(inventory.devices),
            inventory.simulated,
            "simulated" if inventory.simulated else "NVML",
            sum(len(device.mig) for device in inventory.devices),
            simulate_origin=settings.settled.origin("simulate") if settings.settled else "",
        )
    remembered, simulated = _remembered(settings)
    if remembered:
        return PoolSeen(
            device_labels(remembered), simulated, "the ledger", sum(len(d.mig) for d in remembered)
        )
    return PoolSeen((), False, "NVML", problem=inventory.problem or "no GPU found")


def _remembered(settings: GPUShare) -> tuple[list[Device], bool]:
    path = settings.effective_ledger_path()
    if not path.exists():
        return [], False
    try:
        ledger = Ledger(path)
        return ledger.devices(), ledger.simulated()
    except Exception:  # the ledger check says what is wrong with it
        return [], False


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


__all__ = [
    "check_ledger",
    "check_mig",
    "check_modes",
    "check_mps",
    "check_vgpu",
    "local_checks",
    "node_facts",
    "relevant_mode_checks",
    "seen_locally",
]
