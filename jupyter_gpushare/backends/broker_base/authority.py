"""What a kind's broker side answers for (its :class:`Authority`): the backend as each caller may
use it (scoped views), whose each kernel is, and which kernel a calling process belongs to.

A caller acts as themselves — their requests are theirs, held by their process, counted against
their quota — and sees other users' kernels as anonymous occupancy (an admin sees all). Acting on
a kernel needs it to be the caller's: another user's kernel — running, waiting, or one that gave
its slice back and keeps a claim on its id — answers exactly as a kernel that does not exist
(404), so ids reveal nothing and nobody takes over another's id.

A process inside a kernel (the kernel's own process as the ledger records it, or any process it
started) acts on that kernel's slice only; acting on another kernel, even the same user's, is
refused (403). The user's server, console or command line — processes in no kernel — act on any
of the user's kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from jupyter_gpushare.backends.broker_base.identity import Caller
from jupyter_gpushare.backends.processes import same_process
from jupyter_gpushare.backends.protocol import Backend
from jupyter_gpushare.core.errors import NoSuchKernelError, NotYourSliceError
from jupyter_gpushare.core.records import ProcessIdentity


class Authority(Protocol):
    """What the routes ask of the backend behind the broker."""

    @property
    def backend(self) -> Backend:
        """The broker's own backend, unscoped."""

    def as_seen_by(self, caller: Caller) -> Backend:
        """The backend acting as ``caller``, showing what ``caller`` may see."""

    def owner_of(self, kernel_id: str) -> str | None:
        """The user a kernel's slice (or claim on its id, pod, or start) belongs to; None when
        there is none."""

    def kernel_of(self, caller: Caller) -> str | None:
        """The kernel whose processes include the caller's; None for a process in no kernel."""

    def housekeeping(self) -> None:
        """What the broker does every few seconds (release dead kernels' slices, collect orphans)."""


def require_own(authority: Authority, caller: Caller, kernel_id: str, *, missing_ok: bool = False) -> None:
    """Refuse, as "no such kernel", to let ``caller`` act on a kernel of someone else's, and a
    process inside a kernel to act on any other kernel. With ``missing_ok``, a kernel id nobody
    holds or claims passes (a new request; or the backend then says it holds no slice)."""
    owner = authority.owner_of(kernel_id)
    if (owner is None and not missing_ok) or (owner is not None and not caller.may_act_on(owner)):
        raise NoSuchKernelError(f"no GPU kernel {kernel_id} of {caller.user}'s")
    refusal = kernel_scope_refusal(kernel_id, authority.kernel_of(caller))
    if refusal is not None:
        raise NotYourSliceError(refusal)


def kernel_scope_refusal(kernel_id: str, callers_kernel: str | None) -> str | None:
    """Why a process inside kernel ``callers_kernel`` may not act on ``kernel_id`` (None: it
    may; so may any process in no kernel)."""
    if callers_kernel is None or callers_kernel == kernel_id:
        return None
    return (
        f"this process belongs to kernel {callers_kernel}: a kernel acts on its own GPU slice only, "
        f"not on kernel {kernel_id}'s"
    )


def kernel_in_lineage(
    line: Sequence[ProcessIdentity], kernels: Iterable[tuple[str, ProcessIdentity]]
) -> str | None:
    """The kernel whose process is nearest in ``line`` (a process, its parent, … up to init),
    given each kernel's process; None when no process of the line is a kernel's."""
    by_pid: dict[int, list[tuple[str, ProcessIdentity]]] = {}
    for kernel_id, process in kernels:
        by_pid.setdefault(process.pid, []).append((kernel_id, process))
    for ancestor in line:
        for kernel_id, process in by_pid.get(ancestor.pid, ()):
            if same_process(ancestor, process):
                return kernel_id
    return None


__all__ = ["Authority", "kernel_in_lineage", "kernel_scope_refusal", "require_own"]
