"""The broker's backend as each caller may use it: scoped views, and whose each kernel is.

A caller acts as themselves — their requests are theirs, held by their process, counted against
their quota — and sees other users' kernels as anonymous occupancy (an admin sees all). Acting on
a kernel needs it to be the caller's: another user's kernel answers exactly as a kernel that does
not exist (404), so ids reveal nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..errors import NoSuchKernelError
from .identity import Caller

if TYPE_CHECKING:
    from ..backends import Backend
    from ..backends.kubernetes import KubernetesBackend
    from ..backends.local import LocalBackend
    from .pods import PodStarts


class Authority(Protocol):
    """What the routes ask of the backend behind the broker."""

    @property
    def backend(self) -> Backend:
        """The broker's own backend, unscoped."""

    def as_seen_by(self, caller: Caller) -> Backend:
        """The backend acting as ``caller``, showing what ``caller`` may see."""

    def owner_of(self, kernel_id: str) -> str | None:
        """The user a kernel's slice (or pod, or start) belongs to; None when there is none."""

    def housekeeping(self) -> None:
        """What the broker does every few seconds (release dead kernels' slices, collect orphans)."""


def require_own(authority: Authority, caller: Caller, kernel_id: str, *, missing_ok: bool = False) -> None:
    """Refuse, as "no such kernel", to let ``caller`` act on a kernel of someone else's. With
    ``missing_ok``, a kernel nobody holds passes (the backend then says it holds no slice)."""
    owner = authority.owner_of(kernel_id)
    if owner is None and missing_ok:
        return
    if owner is None or not caller.may_act_on(owner):
        raise NoSuchKernelError(f"no GPU kernel {kernel_id} of {caller.user}'s")


class LocalAuthority:
    """The node ledger, for the processes of this node's users."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.local = backend
        backend.samples_every_slice = True  # the broker's monitor samples every kernel

    def as_seen_by(self, caller: Caller) -> LocalBackend:
        if caller.groups:
            self.local.accounts.note_groups(caller.user, caller.groups)
        holder = caller.process if caller.process is not None else self.local.holder
        return self.local.scoped(caller.user, caller.server_id, holder, caller.viewer)

    def owner_of(self, kernel_id: str) -> str | None:
        record = self.local.ledger.get(kernel_id)
        return record.owner if record is not None else None

    def housekeeping(self) -> None:
        self.local.reconcile()
        self.local.accounts.fold()


class KubernetesAuthority:
    """The cluster, for users' servers anywhere in it."""

    def __init__(self, backend: KubernetesBackend, pods: PodStarts) -> None:
        self.backend = backend
        self.cluster = backend
        self.pods = pods

    def as_seen_by(self, caller: Caller) -> KubernetesBackend:
        return self.cluster.scoped(caller.user, caller.server_id, caller.viewer)

    def owner_of(self, kernel_id: str) -> str | None:
        return self.pods.owner_of(kernel_id)

    def housekeeping(self) -> None:
        from .orphans import collect_orphans

        collect_orphans(self.pods)


__all__ = ["Authority", "KubernetesAuthority", "LocalAuthority", "require_own"]
