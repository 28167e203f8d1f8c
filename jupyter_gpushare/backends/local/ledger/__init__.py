"""The node ledger: every slice on this node, in one sqlite file shared by all its processes.

Each decision is one ``BEGIN IMMEDIATE`` transaction: the write lock is taken before anything is
read, so two processes can never both see the same free memory and both take it. Placement itself is
the pure :func:`jupyter_gpushare.core.placement.allocator.fit`; this module only reads rows, asks,
and writes.

A row belongs to a process: the kernel once it runs, before that the process that asked for it
(the server, ``jupyter console``, nbclient…). Reconciliation deletes rows whose process is gone,
comparing pid *and* start time so a reused pid does not keep a dead slice alive.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from jupyter_gpushare.backends.local.ledger import faults as ledger_faults
from jupyter_gpushare.backends.local.ledger import queue, usage
from jupyter_gpushare.backends.local.ledger.access import LOCK_TIMEOUT, RESTORE_WAIT, LedgerAccess
from jupyter_gpushare.backends.local.ledger.queue import LivenessCheck
from jupyter_gpushare.backends.local.ledger.schema import (
    DEVICE_COLUMNS,
    Row,
    device_table,
    insert_released,
    read_devices,
    record_of,
    released_of,
    replace_devices,
    slice_rows,
)
from jupyter_gpushare.backends.local.ledger.state import StateCache
from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.errors import BackendUnavailableError, LedgerError
from jupyter_gpushare.core.placement.allocator import Held, NoFit, Policy, Request, Spot, fit_on_device
from jupyter_gpushare.core.placement.holding import shrink_refusal
from jupyter_gpushare.core.records import (
    DeviceSample,
    KernelSample,
    LedgerState,
    NewRequest,
    Outcome,
    ProcessIdentity,
    ReleasedSlice,
    SliceRecord,
    SuspendedState,
)
from jupyter_gpushare.core.sizes import parse_size

P = ParamSpec("P")
T = TypeVar("T")


def _faults_named(method: Callable[Concatenate[Ledger, P], T]) -> Callable[Concatenate[Ledger, P], T]:
    """Turn any sqlite or file error of a ledger call into the ledger fault it stands for: one
    sentence naming the file and the fix (a 503 in REST), never a traceback."""

    def named(self: Ledger, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as error:
            self._access.forget_thread_connections()
            raise self._access.fault(error) from None

    functools.update_wrapper(named, method)
    return named


class Ledger:
    """Access to one ledger file. Cheap to create; connections are cached per thread.

    The file itself — opening it, checking it is still the one at the path, putting it back,
    bounded locks — is :class:`~jupyter_gpushare.backends.local.ledger.access.LedgerAccess`'s business.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        lock_timeout: float = LOCK_TIMEOUT,
        restore_wait: float = RESTORE_WAIT,
    ) -> None:
        self.path = Path(path)
        self._access = LedgerAccess(self.path, _row_alive, lock_timeout, restore_wait)
        self._access.on_check = self._retry_registration
        self._wanted_devices: tuple[Sequence[Device], bool] | None = None
        self._states = StateCache()

    # ---- the file ------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        return self._access.read()

    @_faults_named
    def change_marker(self) -> int:
        """A number that changes whenever anyone commits what a view of the pool or of the
        kernels could show (a few microseconds).

        The views' version (:mod:`.view_version`), read when sqlite's ``data_version`` says
        anyone committed (by other processes and by this process's other connections alike):
        the accounting's fold, which no view shows, leaves it as it was. It changes too when
        this process moves to a restored file, and when the file is made read-only or writable
        again (no commit, but every view then shows another problem).
        """
        read_only = ledger_faults.not_writable(self.path) is not None
        return (self._access.change_marker() << 1) + read_only

    def change_marker_at_once(self) -> int | None:
        """``change_marker`` when it takes a stat, an access check and a read of sqlite's shared
        memory (microseconds: an event loop may ask); None when it would wait for something, or
        fail: then ``change_marker`` is asked, in a worker thread, and says what is wrong."""
        try:
            marker = self._access.change_marker_at_once()
            read_only = ledger_faults.not_writable(self.path) is not None
        except (LedgerError, sqlite3.Error, OSError):
            return None
        return None if marker is None else (marker << 1) + read_only

    def guard(self, interval: float) -> None:
        """Check the file every ``interval`` seconds (a daemon thread): a deleted ledger is put
        back within one round, and a fault is logged once with its fix."""
        self._access.guard.start(interval)

    def check(self) -> LedgerError | None:
        """The ledger's fault now (after trying to mend it), or None when it is usable."""
        return self._access.check()

    def report_fault(self, fault: BackendUnavailableError) -> None:
        """Log ``fault`` once: not again while it is the fault last logged by anyone in this
        process (the guard's rounds, a kernel's cleanup, a broker's housekeeping)."""
        self._access.guard.report_fault(fault)

    def write_fault(self) -> LedgerError | None:
        """Why this process may not write the ledger now (read-only), or None."""
        return ledger_faults.not_writable(self.path)

    def close(self) -> None:
        self._access.close()

    @_faults_named
    def write_with(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in one write transaction of the ledger (the accounting's fold, a
        kernel's report of its cells)."""
        return self._access.transact(work)

    @_faults_named
    def read_with(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on one consistent snapshot of the ledger, without a lock."""
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            return work(connection)
        finally:
            connection.execute("COMMIT")

    # ---- devices -------------------------------------------------------------------------

    @_faults_named
    def register_devices(self, devices: Sequence[Device], simulated: bool) -> None:
        """Record the pool this node has, so every reader (the CLI too) sees the same devices.

        Remembered: a ledger that could not be written now gets them once it can.
        """
        self._wanted_devices = (devices, simulated)
        rows = [
            dict(
                zip(
                    DEVICE_COLUMNS,
                    (
                        device.uuid,
                        device.index,
                        device.name,
                        device.memory_total,
                        json.dumps([[m.uuid, m.profile, m.memory_total] for m in device.mig]),
                        int(simulated),
                    ),
                    strict=True,
                )
            )
            for device in devices
        ]
        self._access.remember(devices=rows)
        self._access.transact(lambda db: replace_devices(db, rows))

    def _retry_registration(self) -> None:
        """A guard round: register the pool if an earlier attempt met a broken ledger."""
        wanted = self._wanted_devices
        if wanted is not None and self.devices() == [] and wanted[0]:
            self.register_devices(*wanted)

    @_faults_named
    def devices(self) -> list[Device]:
        devices, rows = device_table(self._connection())
        self._access.remember(devices=rows)
        return devices

    @_faults_named
    def simulated(self) -> bool:
        row = self._connection().execute("SELECT MAX(simulated) FROM devices").fetchone()
        return bool(row[0])

    # ---- slices --------------------------------------------------------------------------

    @_faults_named
    def state(self) -> LedgerState:
        """Devices, slices and released kernels from one read transaction, shared until the
        next commit (see :mod:`.state`)."""
        marker = self.change_marker()
        latest = self._states.latest(marker)
        if latest is not None:
            return latest
        state, devices, slices = self._states.read(self._connection(), marker)
        self._access.remember(devices=devices, slices=slices)  # None: nothing new to remember
        return state

    @_faults_named
    def records(self) -> list[SliceRecord]:
        rows = slice_rows(self._connection(), "ORDER BY seq")
        self._access.remember(slices=rows)
        return [record_of(row) for row in rows]

    @_faults_named
    def get(self, kernel_id: str) -> SliceRecord | None:
        rows = slice_rows(self._connection(), "WHERE kernel_id = ?", (kernel_id,))
        return record_of(rows[0]) if rows else None

    @_faults_named
    def released(self, kernel_id: str) -> ReleasedSlice | None:
        """What a kernel that gave its slice back left behind (its token digest, name, path)."""
        query = "SELECT * FROM released WHERE kernel_id = ?"
        row = self._connection().execute(query, (kernel_id,)).fetchone()
        return None if row is None else released_of(row)

    @_faults_named
    def released_all(self) -> list[ReleasedSlice]:
        """Every kernel running without a slice that the ledger still knows of: those whose
        processes hold memory, those suspended, and the claims of the others."""
        rows = self._connection().execute("SELECT * FROM released ORDER BY released_at").fetchall()
        return [released_of(row) for row in rows]

    @_faults_named
    def held(self) -> list[Held]:
        """What placement counts as taken now (:func:`~.queue.held`), for dry runs and checks."""
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            return queue.held(connection)
        finally:
            connection.execute("COMMIT")

    @_faults_named
    def enqueue(self, request: NewRequest) -> SliceRecord:
        """Add a queued request; a kernel that already has a row (a restart) keeps it."""
        record = self._access.transact(lambda db: queue.enqueue(db, request))
        assert record is not None
        return record

    @_faults_named
    def request(self, request: NewRequest, policy: Policy, alive: LivenessCheck = is_alive) -> Outcome:
        """Queue a request and try to place it in one transaction.

        A request that fits at once is never seen queued by anyone else, so concurrent starts on
        a free pool do not wait behind each other.
        """
        return self._access.transact(lambda db: queue.request_placed(db, request, policy, alive))

    @_faults_named
    def try_place(self, kernel_id: str, policy: Policy, alive: LivenessCheck = is_alive) -> Outcome:
        """Place a queued request if it is first in line and fits; otherwise say why not.

        Strict FIFO: a request waits while an earlier one is queued, so a large request is
        never starved by a stream of small ones. A request behind a live one is answered from a
        read, without the write lock, so a long queue's polling does not slow everyone's writes.
        """
        connection = self._connection()
        connection.execute("BEGIN")  # one consistent snapshot for the counts below, no lock
        try:
            waiting = queue.waiting_behind(connection, kernel_id, alive, policy.queue)
        finally:
            connection.execute("COMMIT")
        if waiting is not None:
            return waiting
        return self._access.transact(lambda db: queue.place(db, kernel_id, policy, alive))

    @_faults_named
    def attach_kernel(self, kernel_id: str, kernel: ProcessIdentity | None) -> None:
        """Tie the slice to the kernel process (None: back to the holder, e.g. during a restart)."""

        def tie(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE slices SET kernel_pid = ?, kernel_start = ? WHERE kernel_id = ?",
                (kernel.pid if kernel else None, kernel.start if kernel else None, kernel_id),
            )

        self._access.transact(tie)

    @_faults_named
    def resize(
        self,
        kernel_id: str,
        size: str,
        policy: Policy,
        holding: tuple[int, str | None] = (0, None),
        force: bool = False,
    ) -> Spot | NoFit:
        """Change a running slice's size in place (a live resize cannot move the kernel).

        ``holding``: what the kernel's processes were just measured to hold (bytes, source). A
        size below it is refused; ``force`` takes it anyway, and the held bytes stay counted
        (as the slice's measured use) until the sampler sees them freed.
        """
        parsed = parse_size(size)

        def change(db: sqlite3.Connection) -> Spot | NoFit:
            rows = slice_rows(db, "WHERE kernel_id = ?", (kernel_id,))
            record = record_of(rows[0]) if rows else None
            if record is None or record.state != "running":
                return NoFit(f"kernel {kernel_id} holds no GPU slice", retry=False)
            assert record.device_uuid is not None
            if record.placement != "shared":
                return NoFit(f"a {record.mode} slice cannot be resized in place", retry=False)
            request = Request(kernel_id, record.owner, parsed, record.placement)
            devices = read_devices(db)
            outcome = fit_on_device(request, record.device_uuid, devices, queue.held(db), policy)
            if not isinstance(outcome, Spot):
                return outcome
            held, source = holding
            if held > outcome.memory and not force:
                label = next((d.label for d in devices if d.uuid == record.device_uuid), "its GPU")
                return NoFit(shrink_refusal(size, outcome.memory, held, source, label), retry=False)
            db.execute(
                "UPDATE slices SET memory = ?, size = ?, whole_card = ? WHERE kernel_id = ?",
                (outcome.memory, parsed.canonical, int(outcome.whole_card), kernel_id),
            )
            if held > (record.memory_used or 0):
                # The fresher figure: placement counts it from this transaction on.
                db.execute(
                    "UPDATE slices SET memory_used = ?, usage_source = ?, usage_at = ? WHERE kernel_id = ?",
                    (held, source, time.time(), kernel_id),
                )
            return outcome

        return self._access.transact(change)

    @_faults_named
    def release(
        self,
        kernel_id: str,
        keep_claim: bool = False,
        held: tuple[int, str | None] = (0, None),
        suspended: SuspendedState | None = None,
    ) -> SliceRecord | None:
        """Remove a kernel's slice or queued request; returns what was removed.

        ``keep_claim`` (a running kernel gives its slice back): remember the kernel's token
        digest, name and path, so only that kernel can take a slice under its id again and the
        name and path come back with it; ``held`` (bytes, source) its processes still hold on
        the slice's device, which stays reserved; ``suspended`` its checkpointed GPU state.
        Otherwise (the kernel ends) any such memory goes too.
        """

        def remove(db: sqlite3.Connection) -> SliceRecord | None:
            rows = slice_rows(db, "WHERE kernel_id = ?", (kernel_id,))
            if not rows and keep_claim:
                return None  # nothing to give back: what it left when it released stays
            db.execute("DELETE FROM released WHERE kernel_id = ?", (kernel_id,))
            if not rows:
                return None
            record = record_of(rows[0])
            db.execute("DELETE FROM slices WHERE kernel_id = ?", (kernel_id,))
            if keep_claim:
                left = ReleasedSlice(
                    kernel_id,
                    record.token_hash,
                    record.kernel_name,
                    record.path,
                    record.process,
                    owner=record.owner,
                    device_uuid=record.device_uuid,
                    unit_uuid=record.unit_uuid,
                    held=max(0, held[0]),
                    held_source=held[1],
                    suspended=suspended,
                    attached=record.kernel is not None,
                )
                insert_released(db, left)
            return record

        return self._access.transact(remove)

    @_faults_named
    def withdraw_waiting(self, kernel_ids: Sequence[str]) -> list[SliceRecord]:
        """Remove the requests of ``kernel_ids`` that still wait in the queue (one placed
        meanwhile stays); returns those removed."""

        def withdraw(db: sqlite3.Connection) -> list[SliceRecord]:
            rows = [
                db.execute(
                    "SELECT * FROM slices WHERE kernel_id = ? AND state = 'queued'", (kernel_id,)
                ).fetchone()
                for kernel_id in kernel_ids
            ]
            withdrawn = [record_of(row) for row in rows if row is not None]
            db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(r.kernel_id,) for r in withdrawn])
            return withdrawn

        return self._access.transact(withdraw)

    @_faults_named
    def put_released(self, released: ReleasedSlice) -> None:
        """Write back what a kernel left when it released its slice (a resume that could not
        take a slice leaves the kernel suspended as it was)."""
        self._access.transact(lambda db: insert_released(db, released))

    @_faults_named
    def update_held(self, held: Sequence[tuple[str, int, str | None]]) -> None:
        """What released kernels' processes hold now, ``(kernel_id, bytes, source)`` each (the
        sampler's measure, or a kernel declaring its use on a simulated pool)."""
        rows = [(max(0, used), source, kernel_id, max(0, used)) for kernel_id, used, source in held]
        self._access.transact(
            lambda db: db.executemany(
                "UPDATE released SET held = ?, held_source = ? WHERE kernel_id = ? AND held IS NOT ?", rows
            )
        )

    @_faults_named
    def reconcile(self, alive: LivenessCheck = is_alive) -> list[SliceRecord]:
        """Release every slice and queued request whose process is gone; returns them.

        What released kernels left behind goes with their processes too.
        """

        def remove_dead(db: sqlite3.Connection) -> list[SliceRecord]:
            records = [record_of(row) for row in slice_rows(db)]
            dead = [record for record in records if not alive(record.process)]
            db.executemany("DELETE FROM slices WHERE kernel_id = ?", [(r.kernel_id,) for r in dead])
            gone = [
                (row["kernel_id"],)
                for row in db.execute("SELECT kernel_id, pid, start FROM released").fetchall()
                if not alive(ProcessIdentity(row["pid"], row["start"]))
            ]
            db.executemany("DELETE FROM released WHERE kernel_id = ?", gone)
            return dead

        return self._access.transact(remove_dead)

    @_faults_named
    def record_usage(
        self,
        kernel_samples: Sequence[KernelSample] = (),
        device_samples: Sequence[DeviceSample] = (),
    ) -> None:
        """Write one sampling round (usage and warnings) in a single transaction.

        A sample whose ``source`` is None carries warnings only: the usage stays as the kernel
        reported it, so a report made while the sampler ran is not overwritten.
        """
        self._access.transact(lambda db: usage.write_samples(db, kernel_samples, device_samples, time.time()))

    @_faults_named
    def report_usage(self, kernel_id: str, memory_used: int, utilization: int | None, source: str) -> None:
        """A kernel's own report of its usage (simulated pools, or where NVML cannot see it)."""
        self._access.transact(
            lambda db: usage.write_report(db, kernel_id, memory_used, utilization, source, time.time())
        )

    @_faults_named
    def queue_position(self, kernel_id: str) -> int | None:
        record = self.get(kernel_id)
        if record is None or record.state != "queued":
            return None
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            return queue.head_of_queue(connection, record.seq)[0] + 1
        finally:
            connection.execute("COMMIT")


def _row_alive(row: Row) -> bool:
    """Whether the process of a remembered slice row still runs (it is recorded again)."""
    pid, start = row["kernel_pid"], row["kernel_start"]
    if pid is None:
        pid, start = row["holder_pid"], row["holder_start"]
    return is_alive(ProcessIdentity(int(pid), float(start)))
