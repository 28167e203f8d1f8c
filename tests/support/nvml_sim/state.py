"""The simulated cards the C library serves: written from Python, read by every NVML call.

One file holds the whole simulated driver: its versions, the cards, their compute processes,
per-process utilisation samples and Xid errors. ``write_state`` replaces it atomically (a
temporary file renamed over it), so a reader sees the old state or the new one, never half; the
library notices the new file on its next call.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jupyter_gpushare.core.devices import Inventory

FORMAT = "nvml-sim\t1"


@dataclass(frozen=True)
class SimulatedProcess:
    """A compute process on a card, as nvmlDeviceGetComputeRunningProcesses reports it."""

    pid: int
    used_memory: int | None  # bytes; None where the driver hides it (NVML_VALUE_NOT_AVAILABLE)


@dataclass(frozen=True)
class UtilizationSample:
    """One sample of nvmlDeviceGetProcessUtilization."""

    pid: int
    timestamp: int  # microseconds: NVML answers the samples newer than the timestamp asked
    sm: int  # percent
    memory: int = 0  # percent


@dataclass(frozen=True)
class SimulatedCard:
    """One GPU. ``memory_used`` is what processes use; ``memory_reserved`` what the driver and
    firmware keep (version 1 of the memory call counts it used, version 2 reports it apart)."""

    uuid: str
    name: str
    memory_total: int
    memory_used: int = 0
    memory_reserved: int = 0
    utilization: int | None = 0  # percent; None: NVML answers NotSupported (so do its samples)
    processes: tuple[SimulatedProcess, ...] = ()
    samples: tuple[UtilizationSample, ...] = ()
    xids: tuple[int, ...] = ()  # critical Xid errors, oldest first: each reaches an event set once
    pci_device_id: int = 0x233510DE  # device id << 16 | NVIDIA's vendor id (an H200's)
    compute_capability: tuple[int, int] = (9, 0)
    bus: int | None = None  # the PCI bus; None: from the card's index
    minor: int | None = None  # /dev/nvidia<minor>; None: the card's index

    def record(self, index: int) -> str:
        utilization = "-" if self.utilization is None else str(self.utilization)
        bus = 0x10 + index if self.bus is None else self.bus
        minor = index if self.minor is None else self.minor
        major, minor_cc = self.compute_capability
        fields = ["gpu", self.uuid, self.name, self.memory_total, self.memory_reserved, self.memory_used,
                  utilization, f"00000000:{bus:02X}:00.0", f"0x{self.pci_device_id:08X}", minor,
                  f"{major}.{minor_cc}"]  # fmt: skip
        return _line(fields)


def write_state(
    path: Path, cards: Sequence[SimulatedCard], *, driver: str = "550.54.15", cuda: int = 12040
) -> Path:
    """Replace the state file at ``path`` with ``cards`` (indexed in this order) and the
    driver's versions (``cuda`` as NVML encodes it: 1000 × major + 10 × minor)."""
    uuids = [card.uuid for card in cards]
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"two simulated cards share a UUID: {uuids}")
    lines = [FORMAT, _line(["driver", driver]), _line(["cuda", cuda])]
    lines += [card.record(index) for index, card in enumerate(cards)]
    for card in cards:
        lines += [_line(["process", card.uuid, p.pid, _optional(p.used_memory)]) for p in card.processes]
        lines += [_line(["sample", card.uuid, s.pid, s.timestamp, s.sm, s.memory]) for s in card.samples]
        lines += [_line(["xid", card.uuid, code]) for code in card.xids]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as file:
        file.write("\n".join(lines) + "\n")
    # Every user's, as the driver's state is: a kernel container reads it as its image's user
    # (the temporary file was made for its owner alone).
    os.chmod(file.name, 0o644)
    os.replace(file.name, path)
    return path


def cards_from_inventory(
    inventory: Inventory, *, processes: Iterable[tuple[int, SimulatedProcess]] = ()
) -> list[SimulatedCard]:
    """The cards of a simulated pool (``parse_simulation``), with ``processes`` as (device index,
    process): the same UUIDs, names and memory the simulated backend reports. MIG is not
    simulated at the C ABI: a pool with MIG instances is refused."""
    by_index: dict[int, list[SimulatedProcess]] = {}
    for index, process in processes:
        by_index.setdefault(index, []).append(process)
    cards = []
    for device in inventory.devices:
        if device.mig:
            raise ValueError(f"{device.label} has MIG instances, which the simulated NVML does not serve")
        mine = tuple(by_index.get(device.index, ()))
        used = sum(p.used_memory or 0 for p in mine)
        cards.append(SimulatedCard(device.uuid, device.name, device.memory_total, used, processes=mine))
    return cards


def _optional(value: int | None) -> str:
    return "-" if value is None else str(value)


def _line(fields: Sequence[object]) -> str:
    text = [str(value) for value in fields]
    if any("\t" in value or "\n" in value or "\r" in value for value in text):
        raise ValueError(f"a simulated NVML value holds a tab or a line break: {text}")
    return "\t".join(text)
