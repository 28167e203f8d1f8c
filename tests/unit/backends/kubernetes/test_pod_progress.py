"""A starting kernel pod as the broker's watch shows it: running, on its way, or failed with the
cluster's reason (pure)."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.starting import (
    CREATED,
    GONE_GRACE,
    KernelPodStartError,
    progress,
)
from jupyter_gpushare.core.errors import DoesNotFitError

TIMES = {"unschedulable_grace": 10.0, "launch_timeout": 300.0}


def at(pod: dict[str, Any] | None, waited: float = 1.0, unschedulable_for: float = 0.0) -> Any:
    return progress(pod, "gpushare-kernel-k", waited=waited, unschedulable_for=unschedulable_for, **TIMES)


def pending(**status: Any) -> dict[str, Any]:
    return {"spec": {}, "status": {"phase": "Pending", **status}}


UNSCHEDULABLE = pending(
    conditions=[
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpumem.",
        }
    ]
)


def test_running_with_an_ip() -> None:
    seen = at({"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.0.7"}})
    assert (seen.state, seen.ip, seen.detail) == ("running", "10.0.0.7", "running on n1 (10.0.0.7)")


def test_not_in_the_watch_yet_then_gone() -> None:
    # Created, not shown by the watch yet: it says what the watch will show for it (a long ask
    # is not woken by a step back to "creating").
    assert (unseen(1.0).state, unseen(1.0).detail) == ("starting", at(pending()).detail)
    assert at(pending()).detail == CREATED
    gone = unseen(GONE_GRACE + 1)
    assert gone.state == "failed" and isinstance(gone.error, KernelPodStartError)
    assert gone.detail == "the kernel pod gpushare-kernel-k was deleted while it started"


def test_a_pod_whose_creation_took_long_is_not_taken_for_deleted() -> None:
    """Admitted long ago (creating the pod took a loaded API server a while), created a moment
    ago, not in the watch yet: still starting. Before, the grace counted from admission."""
    assert unseen(1.0, waited=GONE_GRACE + 30).state == "starting"


def unseen(seconds: float, waited: float = 1.0) -> Any:
    return progress(
        None, "gpushare-kernel-k", waited=waited, unschedulable_for=0.0, unseen_for=seconds, **TIMES
    )


def test_the_schedulers_words_then_a_refusal_after_the_grace() -> None:
    waiting = at(UNSCHEDULABLE, unschedulable_for=2.0)
    assert waiting.state == "starting" and waiting.unschedulable
    assert waiting.detail == "pending: 0/1 nodes are available: 1 Insufficient nvidia.com/gpumem."
    refused = at(UNSCHEDULABLE, unschedulable_for=10.0)
    assert isinstance(refused.error, DoesNotFitError) and "Insufficient nvidia.com/gpumem" in str(
        refused.error
    )


def test_an_image_that_cannot_be_pulled_and_a_pod_that_ended() -> None:
    pulling = pending(
        containerStatuses=[
            {
                "name": "kernel",
                "image": "k:1",
                "state": {"waiting": {"reason": "ErrImagePull", "message": "nope"}},
            }
        ]
    )
    assert "the kernel image k:1 cannot be pulled: ErrImagePull: nope" in str(at(pulling).error)
    ended = {
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "memory"},
    }
    assert "ended while starting: Evicted: memory" in str(at(ended).error)


def test_too_long() -> None:
    slow = at(pending(), waited=300.0)
    assert slow.state == "failed" and "c.GPUShare.launch_timeout" in str(slow.error)
