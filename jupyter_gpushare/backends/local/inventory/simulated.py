"""A simulated pool from a one-line description, so everything runs without a GPU.

Grammar (comma separated items)::

    [COUNT x] MODEL-MEMORY GB [ :mig=N x PROFILE (+ N x PROFILE)* ]

for example ``2xA100-80GB,1xT4-16GB`` or ``1xA100-80GB:mig=1x3g.40gb+2x1g.10gb``.
UUIDs are derived from the description so every process reading the same description agrees on
them, which is what lets several servers share one ledger.
"""

from __future__ import annotations

import re
import uuid

from jupyter_gpushare.core.devices import Device, Inventory, MigInstance
from jupyter_gpushare.core.errors import SimulationSpecError
from jupyter_gpushare.core.sizes import GiB

_ITEM = re.compile(
    r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<model>[A-Za-z0-9][A-Za-z0-9 _.]*?)-(?P<memory>\d+)\s*(?:GB|G|GiB)"
    r"(?::mig=(?P<mig>.+))?$",
    re.IGNORECASE,
)
_MIG_PART = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<profile>(?P<g>\d+)g\.(?P<mem>\d+)gb)$", re.I)
_NAMESPACE = uuid.UUID("6f1b7a52-4c1e-4d9b-9a57-1f0c5e2b7d11")

EXAMPLE = "2xA100-80GB,1xT4-16GB (optionally 1xA100-80GB:mig=1x3g.40gb+2x1g.10gb)"


def parse_simulation(spec: str) -> Inventory:
    """Build an inventory from a description such as ``2xA100-80GB,1xT4-16GB``."""
    devices: list[Device] = []
    items = [item.strip() for item in spec.split(",")]
    if not any(items):
        raise SimulationSpecError(f"empty simulated pool description; example: {EXAMPLE}")
    for item in items:
        match = _ITEM.match(item)
        if not match:
            raise SimulationSpecError(f"cannot read simulated device {item!r}; example: {EXAMPLE}")
        count = int(match["count"] or 1)
        memory_gib = int(match["memory"])
        if count < 1 or memory_gib < 1:
            raise SimulationSpecError(f"simulated device {item!r} needs a count and memory above 0")
        model = match["model"].strip()
        for _ in range(count):
            index = len(devices)
            device_uuid = f"GPU-{uuid.uuid5(_NAMESPACE, f'{index}:{model}:{memory_gib}')}"
            mig = _parse_mig(match["mig"], device_uuid, memory_gib, item) if match["mig"] else ()
            devices.append(
                Device(
                    index=index,
                    uuid=device_uuid,
                    name=f"Simulated {model}-{memory_gib}GB",
                    memory_total=memory_gib * GiB,
                    mig=mig,
                )
            )
    return Inventory(devices=tuple(devices), source="simulated", details={"simulate": spec})


def _parse_mig(text: str, device_uuid: str, memory_gib: int, item: str) -> tuple[MigInstance, ...]:
    instances: list[MigInstance] = []
    for part in text.split("+"):
        match = _MIG_PART.match(part.strip())
        if not match:
            raise SimulationSpecError(f"cannot read MIG layout {part!r} in {item!r}; use e.g. 2x1g.10gb")
        for _ in range(int(match["count"] or 1)):
            ordinal = len(instances)
            instances.append(
                MigInstance(
                    uuid=f"MIG-{uuid.uuid5(_NAMESPACE, f'{device_uuid}:{ordinal}')}",
                    profile=match["profile"].lower(),
                    memory_total=int(match["mem"]) * GiB,
                )
            )
    if sum(instance.memory_total for instance in instances) > memory_gib * GiB:
        raise SimulationSpecError(f"MIG instances of {item!r} hold more memory than the card")
    return tuple(instances)
