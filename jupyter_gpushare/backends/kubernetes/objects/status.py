"""Reading kernel pods as the API reports them: why one waits, why one ended. Pure.

The provisioner turns these into the states a person reads ("pending: 0/4 nodes are available:
4 Insufficient nvidia.com/gpumem.") and into the reasons a start fails or a kernel died.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.kueue import stopped_by_kueue

# Container waiting reasons that no amount of waiting fixes.
IMAGE_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONTAINER_FAILURES = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


def event_key(event: dict[str, Any]) -> str:
    """One event occurrence (a repeated event has a new count or time)."""
    metadata = event.get("metadata") or {}
    return f"{metadata.get('uid') or metadata.get('name')}:{event.get('count')}:{event.get('lastTimestamp')}"


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def container_problem(pod: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(reason, message, image)`` of a container that cannot start, if any."""
    for container in _containers(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in IMAGE_FAILURES or reason in CONTAINER_FAILURES:
            return str(reason), str(waiting.get("message") or ""), str(container.get("image") or "?")
    return None


def unschedulable_reason(pod: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """The scheduler's reason while the pod is not placed: its condition or latest event."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return str(condition.get("message") or "unschedulable")
    failed = [event for event in events if event.get("reason") == "FailedScheduling"]
    if failed and not any(event.get("reason") == "Scheduled" for event in events):
        return str(failed[-1].get("message") or "unschedulable")
    return None


def pending_state(pod: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """``pending: Pulling: Pulling image "…"`` — the phase and the latest word about the pod."""
    phase = ((pod.get("status") or {}).get("phase") or "Pending").lower()
    for container in _containers(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            message = f": {waiting['message']}" if waiting.get("message") else ""
            return f"{phase}: {container.get('name')} {waiting['reason']}{message}"
    if events:
        latest = events[-1]
        return f"{phase}: {latest.get('reason')}: {latest.get('message')}"
    return f"{phase}: waiting for the scheduler"


def termination(pod: dict[str, Any]) -> tuple[int, str]:
    """The kernel's exit code and a sentence on why its pod ended (or is ending): Kueue's when
    Kueue stopped it (preempted, evicted: its container's end is only the consequence), else the
    pod's own reason when it has one (Evicted, NodeLost, DeadlineExceeded…), else its
    container's (OOMKilled, Error…)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    code: int | None = None
    detail = ""
    for container in reversed(_containers(pod)):
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is None:
            continue
        exit_code = int(terminated.get("exitCode") or 0)
        if exit_code == 0 and container in (status.get("initContainerStatuses") or []):
            continue
        code = exit_code
        reason = terminated.get("reason") or ("Completed" if code == 0 else "Error")
        message = f": {terminated['message']}" if terminated.get("message") else ""
        detail = f"{reason} (exit code {code}){message}"
        break
    fallback = 0 if phase == "Succeeded" else 1
    kueue = stopped_by_kueue(pod)
    if kueue is not None:
        return (1 if code is None or code == 0 else code), kueue
    if status.get("reason"):
        message = f": {status['message']}" if status.get("message") else ""
        return (fallback if code is None else code), f"{status['reason']}{message}"
    if code is not None:
        return code, detail
    return fallback, "Completed" if phase == "Succeeded" else f"the pod {phase or 'ended'}"


def describe_limits(pod: dict[str, Any]) -> str:
    """``asked for nvidia.com/gpu=1, nvidia.com/gpumem=163840`` from the kernel container."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "kernel":
            limits = (container.get("resources") or {}).get("limits") or {}
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            parts = [f"{name}={value}" for name, value in sorted(limits.items())]
            if "gpu-memory" in annotations:  # KAI asks by annotation
                parts.append(f"gpu-memory={annotations['gpu-memory']}")
            return "asked for " + (", ".join(parts) or "no GPU")
    return "asked for ?"
