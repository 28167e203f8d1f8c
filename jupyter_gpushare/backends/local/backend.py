"""The local backend: slices of this node's GPUs, kept in the node ledger.

Everything that changes a reservation goes through here and from here through the ledger, so no
front end — the server, the CLI, a provisioner, a kernel acting on its own slice — has a second
path around the node's accounting. One instance per process and settings (:func:`local_backend`).
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import logging
import os
import secrets
import time
from collections.abc import Hashable, Sequence

from jupyter_gpushare.backends.keys import server_id_of, token_digest
from jupyter_gpushare.backends.local import checks as local_checks
from jupyter_gpushare.backends.local import holding as holdings
from jupyter_gpushare.backends.local import suspend as suspending
from jupyter_gpushare.backends.local import views as local_views
from jupyter_gpushare.backends.local.accounts import LedgerAccounts
from jupyter_gpushare.backends.local.checkpoint import HelperRunner, Runner
from jupyter_gpushare.backends.local.inventory import Device, Inventory, discover
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.local.monitor import UsageMonitor
from jupyter_gpushare.backends.processes import current_process, identify, runs_within
from jupyter_gpushare.backends.protocol import Backend, NodeSlices, ServerHooks, ServerKernels, WaitCallback
from jupyter_gpushare.backends.queue_wait import settle, wait_for_slice
from jupyter_gpushare.config import GPUShare, settings_env
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.capabilities import NODE_LEDGER, Capabilities
from jupyter_gpushare.core.errors import (
    BackendUnavailableError,
    DoesNotFitError,
    LedgerError,
    NoSliceError,
    NotYourSliceError,
)
from jupyter_gpushare.core.modes import MODES, Grant, NodeFacts, get_mode, probe_node
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, UsagePayload, UsageRowPayload
from jupyter_gpushare.core.placement.allocator import NoFit, Policy, Spot
from jupyter_gpushare.core.placement.holding import released_note
from jupyter_gpushare.core.placement.preview import Preview
from jupyter_gpushare.core.records import (
    Holding,
    NewRequest,
    Outcome,
    ProcessIdentity,
    Refused,
    ReleasedSlice,
    Resumption,
    SliceRecord,
    Suspension,
    UsageReport,
    Waiting,
)
from jupyter_gpushare.core.sizes import bytes_or_none, format_bytes
from jupyter_gpushare.core.slice_request import (
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    SliceRequest,
    make_slice_request,
    stored_label,
)

log = logging.getLogger("jupyter_gpushare")


class LocalBackend(Backend, NodeSlices):
    """Slices on this node for one process (a server, a console, an nbclient run): placing them,
    what a kernel gets with its slice and how it proves the slice is its own, and what slices
    cost. Every role of :mod:`jupyter_gpushare.backends.protocol`."""

    name = "local"
    remote_kernels = False
    capabilities: Capabilities = NODE_LEDGER  # the ledger itself: everything

    def __init__(self, settings: GPUShare, inventory: Inventory | None = None) -> None:
        self.settings = settings
        self.inventory = inventory if inventory is not None else discover(settings.effective_simulate())
        self.ledger = Ledger(settings.effective_ledger_path(), lock_timeout=settings.ledger_lock_timeout)
        self.facts: NodeFacts = probe_node(
            self.inventory,
            libvgpu_path=settings.libvgpu_path,
            mps_pipe_directory=settings.mps_pipe_directory,
        )
        self.owner = settings.effective_owner()
        self.viewer = self.owner  # whose kernels the views show in full (see scoped)
        self.holder: ProcessIdentity = current_process()
        self.server_id = server_id_of(self.owner, os.getpid())
        # A broker samples every slice on the node; a user's process only the kernels it started.
        self.samples_every_slice = False
        # The secret each kernel started here proves its identity with (kept only in memory).
        self._tokens: dict[str, str] = {}
        self._runner: Runner | None = None
        self.accounts = LedgerAccounts(self.ledger, lambda: self.settings)
        self.monitor = UsageMonitor(self)
        self.kernel_views = local_views.KernelViews()  # GET kernels' views, kept per record
        try:
            if self.inventory.devices:
                self.ledger.register_devices(self.inventory.devices, self.inventory.simulated)
            if settings.reconcile_on_start:
                self.reconcile()
        except LedgerError as error:
            # A broken ledger must not stop a server from loading: every call says what is
            # wrong, and the guard registers the pool once the file is usable again.
            log.error("jupyter_gpushare: %s", error)
        self.ledger.guard(settings.sample_interval)

    # ---- settings-derived values ---------------------------------------------------------

    @property
    def policy(self) -> Policy:
        settings = self.settings
        return Policy(
            overcommit=settings.overcommit,
            max_memory_per_kernel=bytes_or_none(settings.max_memory_per_kernel),
            max_memory_per_user=bytes_or_none(settings.max_memory_per_user),
            min_memory=settings.min_memory_bytes(),
            queue=settings.queue_rule(),
        )

    def devices(self) -> list[Device]:
        """The pool's devices with their latest sampled usage (see ``with_sampled_usage``)."""
        return local_views.with_sampled_usage(self.ledger.devices(), self.inventory.devices)

    def check(
        self, memory: object = None, mode: object = None, cores: object = None, kernel_id: str = ""
    ) -> SliceRequest:
        """Validate a request and check this node can honour its mode (raises with the reason)."""
        return local_checks.check(self._asked(kernel_id), self._slice_request(memory, mode, cores))

    def _slice_request(self, memory: object, mode: object, cores: object) -> SliceRequest:
        settings = self.settings
        return make_slice_request(
            memory, mode, cores, settings.default_memory, settings.default_mode, settings.min_memory_bytes()
        )

    def preview(self, memory: object, mode: object = None, cores: object = None) -> Preview:
        """What starting a kernel with this request would do now (``GET fit``, the start
        picker): the same placement a start makes, from the same ledger; nothing is reserved."""
        return local_checks.preview(self._asked(""), self._slice_request(memory, mode, cores))

    def _asked(self, kernel_id: str) -> local_checks.Asked:
        return local_checks.Asked(
            kernel_id,
            self.owner,
            self.ledger,
            self.inventory.problem,
            self.facts,
            self.policy,
            self.settings.when_full,
            self.accounts,
        )

    # ---- what a kernel gets with its slice, and how it proves the slice is its own ----------------

    def grant(self, record: SliceRecord) -> Grant:
        assert record.unit_uuid is not None
        return Grant(
            kernel_id=record.kernel_id,
            mode=record.mode,
            unit_uuid=record.unit_uuid,
            unit_memory=local_views.unit_memory(self.ledger.devices(), record.unit_uuid),
            memory=record.memory,
            cores=record.cores,
        )

    def slice_env(self, record: SliceRecord) -> dict[str, str]:
        """The variables of the slice's mode on this node (device, caps, MPS or HAMi-core)."""
        return get_mode(record.mode).kernel_env(self.grant(record), self.facts)

    def kernel_env(self, record: SliceRecord) -> dict[str, str]:
        """The slice's variables, this process's settings, and the kernel's own-slice token."""
        env = settings_env(self.settings)
        env.update(self.slice_env(record))
        token = self._tokens.get(record.kernel_id)
        if token:
            env[env_names.TOKEN] = token
        return env

    def own_slice(self, kernel_id: str, token: str | None) -> SliceRecord | None:
        """The slice of ``kernel_id`` if ``token`` proves the caller is that kernel.

        None when the kernel holds no slice; an error when the slice exists and the token does
        not match it, so one kernel can never act on another kernel's slice.
        """
        record = self.ledger.get(kernel_id)
        if record is None:
            return None
        if (
            not token
            or record.token_hash is None
            or not hmac.compare_digest(record.token_hash, token_digest(token))
        ):
            raise NotYourSliceError(f"the GPU slice of kernel {kernel_id} belongs to another kernel")
        return record

    def own_warnings(self, kernel_id: str, token: str | None) -> tuple[str, ...]:
        """The warnings on the caller's slice (none without one, or with another kernel's token)."""
        try:
            record = self.own_slice(kernel_id, token)
        except NotYourSliceError:
            return ()
        return record.warnings if record is not None else ()

    def token_for(self, kernel_id: str) -> str | None:
        return self._tokens.get(kernel_id)

    def remember_token(self, kernel_id: str, token: str) -> None:
        """Let a kernel that requests its own slice keep proving its identity with ``token``."""
        self._tokens[kernel_id] = token

    # ---- what slices cost -----------------------------------------------------------------------

    def _in_line(self, records: list[SliceRecord]) -> list[SliceRecord]:
        return self.accounts.in_line(records, self.policy)

    def usage(self, since: float, by: str) -> UsagePayload:
        """The accounting of the viewer's kernels (everyone's for a broker's admin)."""
        return self.accounts.report(since, by, self.viewer)

    def usage_totals(self) -> list[UsageRowPayload]:
        return self.accounts.total_rows(self.viewer)

    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        """A kernel's own report: a cell started (``busy``) or ended at ``at``. A kernel that
        holds no slice (or another kernel's token) reports nothing."""
        try:
            if self.own_slice(kernel_id, token) is None:
                return
        except NotYourSliceError:
            return
        self.accounts.note_activity(kernel_id, busy, at, idle_after, idle_action)

    # ---- acquire / release ---------------------------------------------------------------

    def scoped(self, owner: str, server_id: str, holder: ProcessIdentity, viewer: str) -> LocalBackend:
        """This backend as one caller of a broker sees and uses it: requests are ``owner``'s, held
        by ``holder`` (the caller's process) for server ``server_id``; views are ``viewer``'s.
        Shares the ledger, the pool and the monitor; costs a shallow copy."""
        view = copy.copy(self)
        view.owner, view.server_id, view.holder, view.viewer = owner, server_id, holder, viewer
        return view

    def ask(
        self,
        kernel_id: str,
        request: SliceRequest,
        *,
        kernel_name: str = "",
        path: str = "",
        token_hash: str | None = None,
        only_devices: Sequence[str] | None = None,
        holder: ProcessIdentity | None = None,
    ) -> Outcome:
        """Queue ``request`` for ``kernel_id`` and place it if it fits, in one transaction.

        Placed, or waiting (position and reason), or refused — a refused request, and one that
        would wait where ``when_full = "fail"``, leaves nothing behind. A kernel that already
        holds a slice (a restart) gets it back at once. ``only_devices`` limits where it goes
        (a resume); ``holder`` is the process the slice follows until the kernel is attached.
        """
        only_devices = local_checks.where_allowed(self.ledger, request, only_devices)
        outcome = self.ledger.request(
            NewRequest(
                kernel_id=kernel_id,
                owner=self.owner,
                server_id=self.server_id,
                mode=request.mode.name,
                placement=request.mode.placement,
                size=request.size.canonical,
                cores=request.cores,
                holder=holder or self.holder,
                kernel_name=stored_label(kernel_name, MAX_NAME_BYTES),
                path=stored_label(path, MAX_PATH_BYTES),
                token_hash=token_hash,
                only_devices=None if only_devices is None else tuple(only_devices),
            ),
            self.policy,
        )
        return self._settle(kernel_id, outcome)

    def poll(self, kernel_id: str) -> Outcome:
        """Try again to place a waiting request (strict FIFO); refused once ``queue_timeout`` has
        passed since it was made, or when it was withdrawn meanwhile."""
        try:
            outcome = self.ledger.try_place(kernel_id, self.policy)
        except LookupError:
            # Released while queued (a user withdrew it, or reconciliation): a refusal.
            return Refused(f"the GPU request of kernel {kernel_id} was withdrawn while it waited")
        return self._settle(kernel_id, outcome)

    def _settle(self, kernel_id: str, outcome: Outcome) -> Outcome:
        """Apply ``when_full`` and ``queue_timeout`` to a waiting request; drop a refused one."""
        if isinstance(outcome, Waiting):
            record = self.ledger.get(kernel_id)
            waited = time.time() - record.requested_at if record is not None else 0.0
            outcome = settle(outcome, waited, self.settings.when_full, self.settings.queue_timeout)
        if isinstance(outcome, Refused):
            self.ledger.release(kernel_id)
        return outcome

    async def acquire(
        self,
        kernel_id: str,
        request: SliceRequest,
        *,
        kernel_name: str = "",
        path: str = "",
        on_wait: WaitCallback | None = None,
        only_devices: Sequence[str] | None = None,
        token_hash: str | None = None,
        holder: ProcessIdentity | None = None,
    ) -> SliceRecord:
        """Reserve a slice for ``kernel_id``, queueing FIFO when the pool is full.

        A kernel that already holds a slice (a restart) gets it back at once. Whatever ends the
        wait early — a refusal, the timeout, cancellation — withdraws the queued request.
        ``only_devices`` limits where it goes (a resume); ``token_hash`` keeps the kernel's own
        token (a resume: the kernel keeps proving itself with the token it has); ``holder`` is
        the process the slice follows until the kernel is attached (default: this one).
        """
        if token_hash is None:
            token = secrets.token_urlsafe(24)
            self._tokens[kernel_id] = token
            token_hash = token_digest(token)
        first = await asyncio.to_thread(
            self.ask,
            kernel_id,
            request,
            kernel_name=kernel_name,
            path=path,
            token_hash=token_hash,
            only_devices=only_devices,
            holder=holder,
        )
        return await wait_for_slice(
            kernel_id,
            request,
            first,
            lambda: asyncio.to_thread(self.poll, kernel_id),
            lambda: asyncio.to_thread(self.ledger.release, kernel_id),
            self.settings.queue_poll_interval,
            on_wait,
        )

    def attach_kernel(self, kernel_id: str, pid: int | None) -> None:
        """Let the slice follow the kernel process ``pid`` (None: back to this process)."""
        self.ledger.attach_kernel(kernel_id, identify(pid) if pid is not None else None)

    def free(self, kernel_id: str) -> SliceRecord | None:
        """Remove the kernel's slice or queued request, if any (a shutdown, a failed start)."""
        return self.ledger.release(kernel_id)

    def report_fault(self, fault: BackendUnavailableError) -> None:
        self.ledger.report_fault(fault)  # with the guard's: once between them

    def check_claim(self, kernel_id: str, token: str | None, caller: ProcessIdentity) -> None:
        """Refuse a kernel's own request for a slice under ``kernel_id`` unless it is that kernel.

        A kernel that gave its slice back may take one again under its id: it still has the
        token, and it is the process that held the slice (or runs inside it). Any other caller
        is refused, whatever it sets ``JUPYTER_GPUSHARE_KERNEL_ID`` to.
        """
        released = self.ledger.released(kernel_id)
        if released is None:
            return
        same_token = (
            bool(token)
            and released.token_hash is not None
            and hmac.compare_digest(released.token_hash, token_digest(token or ""))
        )
        if not same_token or not runs_within(caller, released.process):
            raise NotYourSliceError(
                f"kernel id {kernel_id} belongs to another kernel: only the kernel that gave its "
                "GPU slice back can take one under that id again"
            )

    def resize(self, kernel_id: str, memory: object, force: bool = False) -> SliceRecord:
        """Resize a running slice in place; raises with the reason when it cannot.

        What the kernel's processes hold is measured first: a size below it is refused with the
        numbers, unless ``force``, and then the held memory stays reserved until it is freed.
        """
        size = self._slice_request(memory, None, None).size
        current = self.ledger.get(kernel_id)
        held = (
            self.holding(current) if current is not None and current.state == "running" else Holding(0, None)
        )
        outcome = self.ledger.resize(
            kernel_id, size.canonical, self.policy, (held.memory, held.source), force
        )
        if isinstance(outcome, NoFit):
            raise DoesNotFitError(outcome.reason)
        assert isinstance(outcome, Spot)
        record = self.ledger.get(kernel_id)
        assert record is not None
        return record

    def give_back(self, kernel_id: str) -> tuple[SliceRecord, Holding]:
        """Release the slice, measuring first what the kernel's processes hold: that stays
        reserved (``held``) until it is freed; a queued request is withdrawn (its start fails).
        Returns what was released and what is held."""
        record = self.ledger.get(kernel_id)
        if record is None:
            released = self.ledger.released(kernel_id)
            if released is not None and released.suspended is not None:
                raise NoSliceError("this kernel is suspended: it holds no GPU slice to release")
            raise NoSliceError(f"kernel {kernel_id} holds no GPU slice")
        held = self.holding(record) if record.state == "running" else Holding(0, None)
        if self.ledger.release(kernel_id, keep_claim=True, held=(held.memory, held.source)) is None:
            raise NoSliceError(f"kernel {kernel_id} holds no GPU slice")
        if held.memory:
            label = next((d.label for d in self.ledger.devices() if d.uuid == record.device_uuid), "?")
            log.info("%s", released_note(record.memory, held.memory, held.source, label))
        return record, held

    def holding(self, record: SliceRecord) -> Holding:
        """What the kernel's processes hold on the GPU now: NVML on a GPU, declared use on a
        simulated pool (``record``'s own figures when the kernel's process is unknown)."""
        if self.inventory.source == "nvml" and record.kernel is not None:
            return holdings.measure_nvml(record.kernel.pid, [d.uuid for d in self.ledger.devices()])
        return holdings.declared(record)

    @property
    def runner(self) -> Runner:
        """Who runs the driver's checkpoint calls: a helper process (a simulated pool's driver
        keeps its states beside the ledger)."""
        if self._runner is None:
            simulated = self.inventory.simulated or (not self.inventory.devices and self.ledger.simulated())
            self._runner = HelperRunner(f"{self.ledger.path}.checkpoints" if simulated else None)
        return self._runner

    @runner.setter
    def runner(self, runner: Runner) -> None:
        self._runner = runner

    def suspend(self, kernel_id: str) -> Suspension:
        """Checkpoint the kernel's GPU state to host memory and give its slice back for real
        (raises ``CannotSuspendError`` with the reason, keeping the slice, when it cannot)."""
        return suspending.suspend(self, kernel_id)

    async def resume(self, kernel_id: str, on_wait: WaitCallback | None = None) -> Resumption:
        """Wait for a slice like a start (on a card the state can go to), restore and unlock."""
        return await suspending.resume(self, kernel_id, on_wait)

    def released(self, kernel_id: str) -> ReleasedSlice | None:
        return self.ledger.released(kernel_id)

    def declare_held(self, kernel_id: str, used: int) -> None:
        self.ledger.update_held([(kernel_id, used, "simulated")])

    def reconcile(self) -> list[SliceRecord]:
        released = self.ledger.reconcile()
        for record in released:
            log.info(
                "released the %s GPU slice of kernel %s: its process %d is gone",
                format_bytes(record.memory),
                record.kernel_id,
                record.process.pid,
            )
        return released

    def simulated(self) -> bool:
        """Whether the pool is simulated (declared usage is allowed)."""
        return self.inventory.simulated or self.ledger.simulated()

    def start_monitoring(self) -> None:
        """Sample the kernels this process started (a kernel was just attached)."""
        self.monitor.ensure_running()

    # ---- the pool and the kernels (protocol.Pool, protocol.Kernels) ------------------------

    def pool(self) -> PoolPayload:
        """The pool; when the ledger cannot be read, an empty pool whose ``problem`` says why and
        how to fix it (what the panel shows as its banner)."""
        try:
            return self._pool()
        except LedgerError as error:
            return {
                "backend": self.name,
                "simulated": self.inventory.simulated,
                "overcommit": self.settings.overcommit,
                "devices": [],
                "queue": [],
                "problem": str(error),
            }

    def _pool(self) -> PoolPayload:
        state = self.ledger.state()  # one read per change, shared by every view (see Ledger.state)
        fault = self.ledger.write_fault()  # readable but not writable: every change would fail
        return local_views.pool(
            state,
            self.inventory,
            self.facts,
            self.settings,
            self.viewer,
            self._in_line,
            write_fault=None if fault is None else str(fault),
        )

    def all_kernels(self) -> list[KernelPayload]:
        return local_views.all_kernels(self.ledger.state(), self.inventory, self.viewer, self._in_line)

    def kernels(self, server: ServerKernels) -> list[KernelPayload]:
        """This server's slices, and its gpushare kernels without one (see :mod:`.local_views`),
        with when each queued start is expected to be placed and what idle kernels will do."""
        state = self.ledger.state()
        records = self._in_line(list(state.slices))
        views = local_views.server_kernels(
            state,
            self.inventory,
            server,
            self.server_id,
            self.owner,
            self.viewer,
            records,
            self.kernel_views,
            self.accounts.activity(),
        )
        devices = local_views.with_sampled_usage(state.devices, self.inventory.devices)
        self.accounts.describe(views, records, devices, self.policy)
        return views

    def change_marker(self) -> Hashable:
        return self.ledger.change_marker()

    def change_marker_at_once(self) -> Hashable | None:
        return self.ledger.change_marker_at_once()

    def modes(self) -> list[str]:
        return [name for name, mode in MODES.items() if mode.unavailable_reason(self.facts) is None]

    def is_waiting(self, kernel_id: str) -> bool:
        record = self.ledger.get(kernel_id)
        return record is None or record.state == "queued"

    def report_usage(self, kernel_id: str, report: UsageReport) -> None:
        self.ledger.report_usage(kernel_id, report.memory_used, report.utilization, report.source)

    def refresh(self) -> None:
        if not self.monitor.running:
            self.monitor.sample_once()  # keep device figures live with no kernel held

    def check_access(self) -> None:
        fault = self.ledger.check()  # after trying to mend it
        if fault is not None:
            raise fault

    def problem(self) -> str | None:
        try:
            devices = self.ledger.state().devices
        except LedgerError as error:  # the routes answer it; the guard mends what it can
            return str(error)
        empty = local_views.problem(devices, self.inventory)
        if empty is not None:
            return empty
        fault = self.ledger.write_fault()  # readable but not writable: every change would fail
        return None if fault is None else str(fault)

    def location(self) -> str:
        return f"ledger {self.ledger.path}"

    def attach_server(self, hooks: ServerHooks) -> None:
        """Local kernels reach the ledger themselves: nothing to lend."""
