"""How far a starting kernel pod has got, read from the pod as the watch shows it. Pure.

The broker follows the pods it admitted through its list+watch, without an API request per look:
running (with its IP), still on its way (the phase and the latest word), or failed with the
cluster's reason — an image that cannot be pulled, a container that cannot start, a pod that
ended, one the scheduler cannot place past a grace period, or one that took too long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.kueue import Place, held_by_kueue, waiting_state
from jupyter_gpushare.backends.kubernetes.objects.status import (
    IMAGE_FAILURES,
    container_problem,
    pending_state,
    termination,
    unschedulable_reason,
)
from jupyter_gpushare.core.errors import BackendUnavailableError, DoesNotFitError, GPUShareError


class KernelPodStartError(BackendUnavailableError):
    """The kernel pod could not be started; the message carries the cluster's reason."""


@dataclass(frozen=True)
class Progress:
    state: str  # "starting", "running" or "failed"
    detail: str
    error: GPUShareError | None = None
    ip: str | None = None
    unschedulable: bool = False  # the scheduler cannot place it (yet)


# Seconds a created pod may stay out of the watch before it counts as deleted: under load the
# watch delivers a creation seconds late (200 starts at once: part of them failed at 5 s,
# counted from admission, when creating the pods alone had taken longer).
GONE_GRACE = 15.0
CREATED = "pending: waiting for the scheduler"  # a pod just created, as status.pending_state says it


def progress(
    pod: dict[str, Any] | None,
    name: str,
    *,
    waited: float,
    unschedulable_for: float,
    unschedulable_grace: float,
    launch_timeout: float,
    unseen_for: float = 0.0,
    gone_grace: float = GONE_GRACE,
    asked: str | None = None,
    kueue_says: str | None = None,
    kueue_place: Place | None = None,
    kueue_wait: float | None = None,
) -> Progress:
    """Where pod ``name`` stands, ``waited`` seconds after it was admitted (``pod`` None: the
    watch does not show it — not yet, or deleted — and has not for ``unseen_for`` seconds since
    the pod was created). ``asked``: what the pod asks for where its limits do not say it (a DRA
    claim), for the reason a start fails with; ``kueue_says``: why Kueue holds the pod, read from
    its Workload (:func:`~jupyter_gpushare.backends.kubernetes.objects.kueue.why_waiting`);
    ``kueue_place``: where it stands in Kueue's queues (its visibility API); ``kueue_wait``: how
    many more seconds it is expected to wait (:mod:`.kueue_wait`)."""
    if pod is None:
        if unseen_for > gone_grace:
            return _failed(KernelPodStartError(f"the kernel pod {name} was deleted while it started"))
        # Created (the API server answered its creation) but not shown by the watch yet, which
        # lags behind a burst of starts: as any new pod, it waits for the scheduler. Saying
        # "creating" again would move the start back a step, and wake every long ask about it.
        return Progress("starting", CREATED)
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase == "Running" and status.get("podIP"):
        node = (pod.get("spec") or {}).get("nodeName") or "?"
        return Progress("running", f"running on {node} ({status['podIP']})", ip=str(status["podIP"]))
    if phase in ("Succeeded", "Failed"):
        _, reason = termination(pod)
        return _failed(KernelPodStartError(f"the kernel pod {name} ended while starting: {reason}"))
    blocked = container_problem(pod)
    if blocked is not None:
        reason, message, image = blocked
        if reason in IMAGE_FAILURES:
            return _failed(
                KernelPodStartError(f"the kernel image {image} cannot be pulled: {reason}: {message}")
            )
        return _failed(KernelPodStartError(f"the kernel container cannot start: {reason}: {message}"))
    unschedulable = unschedulable_reason(pod, [])
    if unschedulable is not None:
        if unschedulable_for >= unschedulable_grace:
            what = f" (asked for {asked})" if asked else ""
            return _failed(
                DoesNotFitError(f"the cluster cannot place the kernel pod {name}{what}: {unschedulable}")
            )
        return Progress("starting", f"pending: {unschedulable}", unschedulable=True)
    queue = held_by_kueue(pod)  # waiting for Kueue's quota (its reason is on the Workload)
    detail = (
        waiting_state(queue, kueue_says, kueue_place, kueue_wait)
        if queue is not None
        else pending_state(pod, [])
    )
    if waited >= launch_timeout:
        return _failed(
            KernelPodStartError(
                f"the kernel pod {name} did not start within {launch_timeout:g} s "
                f"(c.GPUShare.launch_timeout); last: {detail}"
            )
        )
    return Progress("starting", detail)


def _failed(error: GPUShareError) -> Progress:
    return Progress("failed", str(error), error=error)


__all__ = ["CREATED", "KernelPodStartError", "Progress", "progress"]
