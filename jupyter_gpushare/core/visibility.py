"""Other users' slices are anonymous occupancy: written once, for every view of every backend.

A viewer sees everything of their own kernels. Of another user's slice they see only what the pool
needs to be read right — that memory is held, where, how much, in which mode, its place in the
queue — and never its kernel id, notebook, kernelspec, pod, warnings or what its start is doing.
"""

from __future__ import annotations

from jupyter_gpushare.core.payloads import KernelPayload, QueuePayload

ANONYMOUS = "another user"
# The viewer who sees every user's kernels in full: an admin of a broker (root on a team box, a
# hub admin on a cluster). No OS or hub user name can contain a NUL character.
EVERYONE = "\x00everyone"

# What another user's kernel shows instead of its own values.
_HIDDEN_KERNEL_FIELDS: dict[str, object] = {
    "kernel_id": None,
    "kernel_name": "",
    "path": "",
    "owner": ANONYMOUS,
    "warnings": [],
}
_HIDDEN_IF_PRESENT = ("pod", "detail")


def kernel_as_seen(view: KernelPayload, viewer: str) -> KernelPayload:
    """``view`` as ``viewer`` may see it (unchanged for the owner and for an admin)."""
    if view["owner"] == viewer or viewer == EVERYONE:
        return view
    seen: KernelPayload = {**view, **_HIDDEN_KERNEL_FIELDS}  # type: ignore[typeddict-item]
    for name in _HIDDEN_IF_PRESENT:
        if name in seen:
            seen[name] = None  # type: ignore[literal-required]
    return seen


def queue_entry_as_seen(entry: QueuePayload, viewer: str) -> QueuePayload:
    if entry["owner"] == viewer or viewer == EVERYONE:
        return entry
    return {**entry, "kernel_id": None, "owner": ANONYMOUS}


def visible_kernel_id(kernel_id: str | None, owner: str, viewer: str) -> str | None:
    """A kernel id as ``viewer`` may see it: their own, else None."""
    return kernel_id if owner == viewer or viewer == EVERYONE else None
