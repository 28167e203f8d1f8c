"""What ``jupyter gpushare doctor`` reports, whoever checks: one line per check (its name, OK /
WARN / FAIL, what it found, the fix), a backend kind's findings, and the GPUs line every way to a
pool shows (the node's own, the ledger's, the broker's). Pure: the kinds' checks
(``doctor_checks`` of :mod:`jupyter_gpushare.backends.registry`, in each kind's package) and the
doctor's front end build on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from jupyter_gpushare.core.devices import Device

Status = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text}\n      fix: {self.fix}" if self.fix and self.status != "OK" else text


@dataclass(frozen=True)
class Findings:
    """A backend kind's checks (its ``doctor_checks``), and what the test kernel's check needs."""

    checks: list[Check]
    ready: bool  # whether the pool can give a kernel a slice, so the test kernel should start
    simulated: bool  # a simulated pool (the test kernel's GPU is then declared, not real)


@dataclasses.dataclass(frozen=True)
class PoolSeen:
    """The devices kernels would be placed on, and where the doctor learnt of them."""

    devices: tuple[str, ...]  # "GPU0 Simulated A100-80GB"
    simulated: bool
    source: str  # "NVML", "simulated", "the ledger", "the broker"
    mig_instances: int = 0
    problem: str | None = None  # why there is none
    # Where this process's simulated pool was asked for: a config file, "$JUPYTER_GPUSHARE_SIMULATE",
    # "the command line" (config.Settled.origin), so that the fix names the place to change.
    simulate_origin: str = ""


def device_labels(devices: Sequence[Device]) -> tuple[str, ...]:
    """How the doctor names devices: "GPU0 Simulated A100-80GB"."""
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
            "a process with c.GPUShare.simulate or $JUPYTER_GPUSHARE_SIMULATE (make demo does "
            "this) registered it; on a GPU node, a server without either registers the real cards "
            "instead",
        )
    if pool.simulated:
        return Check(
            "GPUs",
            "WARN",
            f"simulated pool ({names}); no real GPU is used",
            f"{stop_simulating(pool.simulate_origin)} on a GPU node",
        )
    if pool.source == "the ledger":
        return Check("GPUs", "OK", f"{len(pool.devices)} remembered by the ledger: {names}")
    return Check("GPUs", "OK", f"{len(pool.devices)} via NVML (driver {driver}): {names}")


def stop_simulating(origin: str) -> str:
    """What to change so that a simulated pool, asked for at ``origin``, is no longer simulated."""
    if origin.startswith("$"):
        return f"unset {origin}"
    if origin.startswith("/"):
        return f"remove c.GPUShare.simulate from {origin}"
    if origin and origin != "default":
        return f"remove GPUShare.simulate from {origin}"
    return "unset c.GPUShare.simulate / $JUPYTER_GPUSHARE_SIMULATE"


__all__ = ["Check", "Findings", "PoolSeen", "Status", "check_gpus", "device_labels", "stop_simulating"]
