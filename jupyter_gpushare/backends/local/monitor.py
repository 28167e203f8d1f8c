"""Sampling usage every ``sample_interval`` seconds and acting on it (the watchdog's hands).

One monitor thread runs in each process that manages kernels (a server, a console, an nbclient
run), for the kernels that process started: it measures them (NVML, or the kernel's own report on
a simulated pool), writes usage and warnings to the ledger for every reader, and applies
``over_limit_action`` once each time a kernel in a soft mode crosses its slice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Protocol

import psutil

from jupyter_gpushare.backends.local.holding import process_tree
from jupyter_gpushare.backends.local.usage.attribution import ProcessUsage, attribute
from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.core.modes import get_mode
from jupyter_gpushare.core.records import DeviceSample, KernelSample, ReleasedSlice, SliceRecord
from jupyter_gpushare.core.sizes import format_bytes
from jupyter_gpushare.core.watchdog import DeviceUsage, KernelUsage, assess

if TYPE_CHECKING:
    from jupyter_gpushare.backends.local.accounts import LedgerAccounts
    from jupyter_gpushare.backends.local.ledger import Ledger
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.core.devices import Inventory
    from jupyter_gpushare.core.records import ProcessIdentity


class MonitoredNode(Protocol):
    """What the monitor samples for: the local backend of its process."""

    settings: GPUShare
    ledger: Ledger
    inventory: Inventory
    holder: ProcessIdentity
    samples_every_slice: bool  # a broker: every slice on the node is its to sample
    accounts: LedgerAccounts  # folds what the round changed into the accounting


log = logging.getLogger("jupyter_gpushare")

_ACTION_NOTES = {
    "warn": "over_limit_action=warn: nothing was stopped",
    "interrupt": "over_limit_action=interrupt: the running cell was interrupted",
    "kill": "over_limit_action=kill: the kernel was killed",
}
IDLE_ROUNDS_BEFORE_EXIT = 3


class UsageMonitor:
    def __init__(self, node: MonitoredNode) -> None:
        self.node = node
        self._over_limit: set[str] = set()
        self._last_sample_us = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------------

    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpushare-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        idle_rounds = 0
        while not self._stop.wait(self.node.settings.sample_interval):
            try:
                tracked = self.sample_once()
            except Exception:  # a busy or replaced ledger file must not end monitoring
                log.debug("GPU usage sampling failed", exc_info=True)
                continue
            idle_rounds = 0 if tracked else idle_rounds + 1
            if idle_rounds >= IDLE_ROUNDS_BEFORE_EXIT:
                return  # restarted by the next kernel launch

    # ---- one round -----------------------------------------------------------------------

    def sample_once(self) -> int:
        """Measure, assess, act and record; returns how many of our kernels were sampled."""
        ledger = self.node.ledger
        state = ledger.state()  # read once per change, shared with the process's views
        running = [r for r in state.slices if r.state == "running" and r.device_uuid]
        mine = (
            running
            if self.node.samples_every_slice
            else [record for record in running if record.holder == self.node.holder]
        )
        devices = state.devices
        nvml = self.node.inventory.source == "nvml"
        # Kernels that released their slice while their processes held memory: placement keeps
        # it reserved until NVML sees it freed (on a simulated pool the kernel declares it).
        left = [row for row in state.released if row.device_uuid] if nvml else []
        measured, device_usage = self._measure(running, [device.uuid for device in devices], left)
        if left:
            ledger.update_held(
                [
                    (
                        row.kernel_id,
                        measured[row.kernel_id].memory if row.kernel_id in measured else 0,
                        "nvml",
                    )
                    for row in left
                ]
            )

        usage = {
            record.kernel_id: KernelUsage(
                record.kernel_id,
                record.memory,
                measured[record.kernel_id].memory if record.kernel_id in measured else record.memory_used,
                measured[record.kernel_id].utilization
                if record.kernel_id in measured
                else record.utilization,
            )
            for record in running
        }
        samples: list[KernelSample] = []
        by_uuid = {device.uuid: device for device in devices}
        for record in mine:
            device = by_uuid.get(record.device_uuid or "")
            if device is None:
                continue
            used, utilization = device_usage.get(device.uuid, (None, None))
            neighbours = [
                usage[other.kernel_id]
                for other in running
                if other.device_uuid == device.uuid and other.kernel_id != record.kernel_id
            ]
            verdict = assess(
                usage[record.kernel_id],
                DeviceUsage(device.label, device.memory_total, used, utilization),
                neighbours,
                self.node.settings.overcommit,
            )
            warnings = list(verdict.warnings)
            if verdict.over_limit and get_mode(record.mode).soft_limit:
                if record.kernel_id not in self._over_limit:
                    self._over_limit.add(record.kernel_id)
                    self._act(record, usage[record.kernel_id], device.label)
                warnings.append(_ACTION_NOTES[self.node.settings.over_limit_action])
            else:
                self._over_limit.discard(record.kernel_id)
            kernel_measure = measured.get(record.kernel_id)
            samples.append(
                KernelSample(
                    record.kernel_id,
                    kernel_measure.memory if kernel_measure else None,
                    kernel_measure.utilization if kernel_measure else None,
                    "nvml" if kernel_measure else None,  # None: keep the kernel's own report
                    tuple(warnings),
                )
            )
        device_samples = [
            DeviceSample(uuid, used, utilization) for uuid, (used, utilization) in device_usage.items()
        ]
        ledger.record_usage(samples, device_samples)
        self.node.accounts.fold()  # this round's changes, and every other since the last fold
        return len(mine)

    def _measure(
        self, running: list[SliceRecord], device_uuids: list[str], released: list[ReleasedSlice]
    ) -> tuple[dict[str, ProcessUsage], dict[str, tuple[int | None, int | None]]]:
        """Per-kernel and per-device usage: NVML where there is a GPU, reports otherwise."""
        if self.node.inventory.source == "nvml":
            from jupyter_gpushare.backends.local.usage.nvml_usage import read_snapshot

            # Process utilisation over the window since the last round, not NVML's whole buffer.
            since = self._last_sample_us
            self._last_sample_us = int(time.time() * 1_000_000)
            snapshot = read_snapshot(device_uuids, since)
            trees = {r.kernel_id: process_tree(r.kernel.pid) for r in running if r.kernel is not None}
            trees.update({row.kernel_id: process_tree(row.process.pid) for row in released})
            devices: dict[str, tuple[int | None, int | None]] = dict(snapshot.devices)
            measured = attribute(snapshot.processes, trees)
            for record in running:
                # NVML measured this kernel before and lists none of its processes now: it has
                # stopped using the GPU. Keeping the old figure would keep stale warnings alive.
                if record.kernel_id not in measured and record.usage_source == "nvml":
                    measured[record.kernel_id] = ProcessUsage(0, None)
            return measured, devices
        # A simulated pool: the device's use is what its kernels declared.
        reported: dict[str, tuple[int | None, int | None]] = {}
        for uuid in device_uuids:
            on_device = [r for r in running if r.device_uuid == uuid]
            memories = [r.memory_used for r in on_device if r.memory_used is not None]
            utilizations = [r.utilization for r in on_device if r.utilization is not None]
            reported[uuid] = (
                sum(memories),
                min(100, sum(utilizations)) if utilizations else None,
            )
        return {}, reported

    def _act(self, record: SliceRecord, usage: KernelUsage, device: str) -> None:
        action = self.node.settings.over_limit_action
        used = usage.memory_used or 0
        log.warning(
            "Kernel %s uses %s of its %s GPU slice (%d%%) on %s: over its slice; over_limit_action=%s",
            record.kernel_id,
            format_bytes(used),
            format_bytes(record.memory),
            round(100 * used / record.memory) if record.memory else 0,
            device,
            action,
        )
        if action == "warn" or record.kernel is None or not is_alive(record.kernel):
            return  # never signal a pid that now belongs to another process
        if action == "interrupt":
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.kernel.pid, signal.SIGINT)
            return
        # Kill the whole tree: a child holding GPU memory must not outlive its kernel.
        try:
            kernel = psutil.Process(record.kernel.pid)
            processes = [*kernel.children(recursive=True), kernel]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
