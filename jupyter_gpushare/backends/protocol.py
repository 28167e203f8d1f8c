"""What a backend answers, split into the roles its callers use.

A caller holds the role it uses and never asks which backend is behind it. Each role is an
abstract base class; a backend declares the roles it implements by deriving from them:

* :class:`Pool` — the pool as this process sees it: devices and queue, the change marker, where
  it is kept and what is wrong with it (the server's snapshots and stream, ``status``, the
  broker's routes, ``%gpu pool``).
* :class:`Kernels` — the kernels and their requests as a server starts and shows them: checks,
  previews, the views of ``GET kernels``, pods' usage reports, what a running kernel's slice can
  do (the server, the broker's routes, the metrics, ``status``).
* :class:`Accounting` — what kernels reserved and used (``GET usage``, the Prometheus counters).
* :class:`Backend` — the three together: what :func:`jupyter_gpushare.backends.backend_for`
  returns to the front ends (the server, the CLI, the broker's routes).
* :class:`CellNotes` — what a kernel tells and asks of its slice around every cell; a kind may
  answer it without building its backend (:func:`jupyter_gpushare.backends.cell_notes_for`).
* :class:`NodeSlices` — a node's kernels' slices as a local kernel's provisioner and the kernel
  itself (``%gpu``) take, resize, give back, suspend and resume them, the kernel proving who it
  is with its token (:func:`jupyter_gpushare.backends.node_slices_for`); the ``CellNotes`` calls
  included.

The node ledger (:mod:`.local`) and the GPU broker's client (:mod:`.broker_client`) are each a
``Backend`` and ``NodeSlices``; the cluster (:mod:`.kubernetes`), whose kernels are
pods that act on their slices through their server, is a ``Backend`` only. docs/development.md
("Backend roles") has the table of roles, members and callers. Refusals are domain errors
(:mod:`jupyter_gpushare.core.errors`) whose type says which HTTP status a server answers with.

Starting, restarting and stopping a kernel are the kernel manager's business: its provisioner
(:mod:`jupyter_gpushare.backends.provisioner`) takes the slice. What a server knows of its own
kernels — their names, what their starts are doing — it hands to the backend as
:class:`ServerKernels` so that the backend can describe them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.capabilities import Capabilities
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.errors import BackendUnavailableError
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, UsagePayload, UsageRowPayload
from jupyter_gpushare.core.placement.preview import Preview
from jupyter_gpushare.core.records import (
    Holding,
    ProcessIdentity,
    ReleasedSlice,
    Resumption,
    SliceRecord,
    Suspension,
    UsageReport,
)
from jupyter_gpushare.core.slice_request import SliceRequest

WaitCallback = Callable[[int, str], None]  # (queue position, reason) while a request waits


@dataclass(frozen=True)
class ServerKernels:
    """What one server knows of its own kernels (a snapshot, taken for each view)."""

    ids: frozenset[str] = frozenset()  # the kernel manager's kernels and starts in flight
    gpushare: frozenset[str] = frozenset()  # those started by gpushare-provisioner
    starting: frozenset[str] = frozenset()  # starts not finished yet (queued, or a pod coming up)
    ended: frozenset[str] = frozenset()  # whose process or pod ended and is not back yet
    names: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # id -> (kernelspec, path)
    details: Mapping[str, str] = field(default_factory=dict)  # id -> what its start is doing
    warnings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # id -> from the server

    def name_of(self, kernel_id: str) -> tuple[str, str]:
        return self.names.get(kernel_id, ("", ""))


@dataclass(frozen=True)
class ServerHooks:
    """What a server lends the backend of its process.

    ``report_base`` is where kernels that cannot reach the pool themselves (pods) report to
    (``http://10.1.2.3:8888/user/alice/``; a function, because the port is known only once the
    server listens). ``on_new_pod`` is told a kernel id whenever that kernel comes back in a new
    pod (the server makes its browsers reconnect).
    """

    report_base: Callable[[], str | None] | None = None
    on_new_pod: Callable[[str], object] | None = None


class Pool(ABC):
    """The pool as one process sees it: its devices and queue (other users' slices anonymous),
    whether it can be read, and where it is kept."""

    settings: GPUShare  # what it answers with: sizes, defaults, intervals, limits

    @property
    @abstractmethod
    def name(self) -> str:
        """The backend kind's name: the ``backend`` field of ``GET pool``."""

    @abstractmethod
    def pool(self) -> PoolPayload:
        """``GET pool``: devices, reservations, the queue; other users' slices anonymous."""

    @abstractmethod
    def modes(self) -> list[str]:
        """The sharing modes this pool can honour now."""

    @abstractmethod
    def change_marker(self) -> Hashable:
        """Changes whenever ``pool`` or ``Kernels.kernels`` could answer differently (render
        caches)."""

    @abstractmethod
    def change_marker_at_once(self) -> Hashable | None:
        """``change_marker`` if it can be told without waiting — from memory, or a local file in
        microseconds — so that an event loop may ask; None when it would wait for a lock, a
        process or the network, or fail: then ``change_marker`` is asked in a worker thread."""

    @abstractmethod
    def refresh(self) -> None:
        """Take a usage sample now if nothing else samples (a panel is open, no kernel runs)."""

    @abstractmethod
    def check_access(self) -> None:
        """Raise (a ``BackendUnavailableError``) when the pool cannot be read at all — a broken
        ledger file, no cluster — with the sentence that says what and the fix."""

    @abstractmethod
    def problem(self) -> str | None:
        """Why the pool may be empty, stale or wrong now, as a sentence; None when it is fine."""

    @abstractmethod
    def location(self) -> str:
        """Where the pool is kept, for logs and ``status``: the ledger file, or the namespace."""


class Kernels(ABC):
    """Kernels and their requests as a server starts and shows them."""

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend can do with a running kernel's slice: callers ask this, never
        which backend it is; what is not offered is refused with ``NotOfferedError``."""

    @property
    @abstractmethod
    def remote_kernels(self) -> bool:
        """Whether kernels run elsewhere (pods) and reach the server over the network."""

    @abstractmethod
    def attach_server(self, hooks: ServerHooks) -> None:
        """A server in this process lends its hooks (see :class:`ServerHooks`)."""

    @abstractmethod
    def kernels(self, server: ServerKernels) -> list[KernelPayload]:
        """``GET kernels``: this server's kernels, queued, running and without a slice. The views
        are the caller's to read, not to change: a backend may hand out the same view again."""

    @abstractmethod
    def all_kernels(self) -> list[KernelPayload]:
        """Every slice this backend sees, other users' as anonymous occupancy (status, metrics)."""

    @abstractmethod
    def check(self, memory: object, mode: object, cores: object, kernel_id: str) -> SliceRequest:
        """The checked request, or the refusal of what can never start (a bad size or mode, a
        size larger than any device, a quota): before anything is reserved or created."""

    @abstractmethod
    def preview(self, memory: object, mode: object, cores: object) -> Preview:
        """What a start of this request would do now — start where, wait at which position, or
        never and why — from what decides a real start; nothing is reserved (``GET fit``)."""

    @abstractmethod
    def is_waiting(self, kernel_id: str) -> bool:
        """Whether the kernel's slice is not placed yet (queued, or its pod not running)."""

    @abstractmethod
    def report_usage(self, kernel_id: str, report: UsageReport) -> None:
        """A kernel's own report of its GPU use (kernels in pods; simulated pools)."""


class Accounting(ABC):
    """What kernels reserved and used, as the accounting kept it."""

    @abstractmethod
    def usage(self, since: float, by: str) -> UsagePayload:
        """``GET usage``: what the caller's kernels (everyone's for an admin) reserved and used
        over the last ``since`` seconds, by ``user``, ``group`` or ``kernel``; raises
        ``NoAccountingError`` where no accounting is kept."""

    @abstractmethod
    def usage_totals(self) -> list[UsageRowPayload]:
        """Each user's figures since accounting began (the caller's own unless an admin): the
        Prometheus counters."""

    @abstractmethod
    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        """A kernel's own report: a cell started (``busy``) or ended at ``at``; what its idle
        timer does after ``idle_after`` seconds (``idle_action``). Kept where the accounting is
        (nothing is kept where none is); ``token`` is the kernel's own, where it is checked."""


class Backend(Pool, Kernels, Accounting, ABC):
    """The service API: the pool, the kernels and the accounting, as one process sees them —
    what a front end (the server, the CLI, the broker's routes) holds."""


class CellNotes(ABC):
    """What a kernel tells and asks of its slice around every cell (``token`` proves it is that
    kernel). Answered by the kernel's backend, or — where building that backend costs more than a
    cell should (devices probed) — by a lighter object its kind makes (``BackendKind.cell_notes``)."""

    @abstractmethod
    def released(self, kernel_id: str) -> ReleasedSlice | None:
        """What a kernel that gave its slice back left counted (held memory, a suspended
        state); None where nothing is kept (a broker keeps no such row for a kernel yet)."""

    @abstractmethod
    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        """A kernel's own report: a cell started (``busy``) or ended at ``at``; what its idle
        timer does after ``idle_after`` seconds (``idle_action``)."""

    @abstractmethod
    def own_warnings(self, kernel_id: str, token: str | None) -> tuple[str, ...]:
        """The warnings on the slice of ``kernel_id`` if ``token`` proves the caller is that
        kernel (none when it holds no slice)."""


class NodeSlices(CellNotes, ABC):
    """A node's kernels' slices, as a local kernel's start (its provisioner) and the kernel
    itself (``%gpu``, and around every cell the :class:`CellNotes` calls) take and change them:
    the node ledger in this process (:mod:`.local`), or the broker that holds it
    (:mod:`.broker_client`). Checking a request first is the ``Kernels`` role's
    :meth:`~Kernels.check`."""

    @abstractmethod
    async def acquire(
        self,
        kernel_id: str,
        request: SliceRequest,
        *,
        kernel_name: str = "",
        path: str = "",
        on_wait: WaitCallback | None = None,
    ) -> SliceRecord:
        """Reserve a slice for ``kernel_id``, waiting in the FIFO queue when the pool is full."""

    @abstractmethod
    def attach_kernel(self, kernel_id: str, pid: int | None) -> None:
        """Let the slice follow kernel process ``pid`` (None: back to the starting process)."""

    @abstractmethod
    def start_monitoring(self) -> None:
        """Make sure the kernel just attached is sampled (by this process, or by the broker)."""

    @abstractmethod
    def free(self, kernel_id: str) -> SliceRecord | None:
        """Remove the kernel's slice or queued request, if any (a shutdown, a failed start)."""

    @abstractmethod
    def report_fault(self, fault: BackendUnavailableError) -> None:
        """Log why the ledger or the broker could not be used, once: not again while it is the
        fault this process logged last (a server stopping with many kernels says it once)."""

    @abstractmethod
    def check_claim(self, kernel_id: str, token: str | None, caller: ProcessIdentity) -> None:
        """Refuse a kernel's own request for a slice under ``kernel_id`` unless it is the kernel
        that gave that id's slice back."""

    @abstractmethod
    def resize(self, kernel_id: str, memory: object, force: bool = False) -> SliceRecord:
        """Resize a running slice in place; raises with the reason when it cannot. ``force``:
        shrink below what the kernel's processes hold, that memory kept reserved
        (``capabilities.can_force_shrink``; else :class:`~jupyter_gpushare.core.errors.NotOfferedError`)."""

    @abstractmethod
    def give_back(self, kernel_id: str) -> tuple[SliceRecord, Holding]:
        """Release a running kernel's slice while the kernel runs on (it keeps its claim on its
        id and may take a slice again); what was released, and what its processes still hold
        (kept reserved until freed)."""

    @abstractmethod
    def suspend(self, kernel_id: str) -> Suspension:
        """Move the kernel's GPU state to host memory and give its slice back
        (``capabilities.can_suspend``; else :class:`~jupyter_gpushare.core.errors.NotOfferedError`)."""

    @abstractmethod
    async def resume(self, kernel_id: str, on_wait: WaitCallback | None = None) -> Resumption:
        """Wait for a slice like a start and restore a suspended kernel's GPU state."""

    @abstractmethod
    def declare_held(self, kernel_id: str, used: int) -> None:
        """A released kernel declares what its processes still hold (simulated pools)."""

    @abstractmethod
    def kernel_env(self, record: SliceRecord) -> dict[str, str]:
        """The environment a kernel holding ``record`` starts with (settings, slice, token)."""

    @abstractmethod
    def own_slice(self, kernel_id: str, token: str | None) -> SliceRecord | None:
        """The slice of ``kernel_id`` if ``token`` proves the caller is that kernel."""

    @abstractmethod
    def token_for(self, kernel_id: str) -> str | None:
        """The own-slice token of a kernel this process started."""

    @abstractmethod
    def remember_token(self, kernel_id: str, token: str) -> None:
        """Keep proving ``kernel_id``'s identity with ``token`` (a kernel acting on itself)."""

    @abstractmethod
    def devices(self) -> list[Device]:
        """The pool's devices with their latest usage (a slice's device by its label)."""

    @abstractmethod
    def simulated(self) -> bool:
        """Whether the pool is simulated (declared usage is allowed)."""


__all__ = [
    "Accounting",
    "Backend",
    "CellNotes",
    "Kernels",
    "NodeSlices",
    "Pool",
    "ServerHooks",
    "ServerKernels",
    "WaitCallback",
]
