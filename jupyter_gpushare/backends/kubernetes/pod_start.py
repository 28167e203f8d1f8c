"""Bringing one kernel pod up: create it (:mod:`.kernel_objects` creates its Secret and claim),
wait for it to run, say why it does not.

Blocking calls run in threads (the API client is synchronous). While the pod waits, its phase and
the cluster's events are reported as they come (``on_state`` and the log); for a pod Kueue holds
behind its admission gate, Kueue's reason from its Workload. A pod the scheduler cannot place past
``unschedulable_grace`` (one Kueue holds waits for quota, not for a node: never), an image that
cannot be pulled, a pod that ends while starting, or ``timeout`` end the wait with the cluster's
reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError
from jupyter_gpushare.backends.kubernetes.kueue_reads import PlaceReader, WorkloadReader
from jupyter_gpushare.backends.kubernetes.objects.claims import allocated_mode
from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    Place,
    held_by_kueue,
    waiting_state,
    why_waiting,
    workload_selector,
)
from jupyter_gpushare.backends.kubernetes.objects.manifests import KERNEL_ID_LABEL, label_value
from jupyter_gpushare.backends.kubernetes.objects.status import (
    IMAGE_FAILURES,
    container_problem,
    describe_limits,
    event_key,
    pending_state,
    termination,
    unschedulable_reason,
)
from jupyter_gpushare.core.errors import BackendUnavailableError, DoesNotFitError

CONFLICT_RETRY = 0.2  # seconds between tries to reuse the name of a pod still being deleted


class KernelPodError(BackendUnavailableError):
    """The kernel pod could not be started; the message carries the cluster's reason."""


@dataclass
class PodStart:
    """One start of kernel ``kernel_id``'s pod ``pod`` in ``cluster``."""

    cluster: Cluster
    kernel_id: str
    pod: str
    secret: str
    on_state: Callable[[str], None]
    log: logging.Logger | logging.LoggerAdapter[Any]
    poll_interval: float
    unschedulable_grace: float
    last_state: str = ""
    claim: str | None = None  # the pod's ResourceClaim (DRA presets)
    asked: str | None = None  # what the pod asks for, where its limits do not say (a claim)
    kueue_reason: str | None = None  # Kueue's last word on the Workload, kept over a failed read
    kueue_place: Place | None = None  # where it stands in Kueue's queues, kept likewise
    workloads: WorkloadReader = field(init=False)
    places: PlaceReader = field(init=False)

    def __post_init__(self) -> None:
        self.workloads = WorkloadReader(self.cluster, self.log, f"Kernel {self.kernel_id}: ")
        self.places = PlaceReader(self.cluster, self.log, f"Kernel {self.kernel_id}: ")

    def say(self, state: str) -> None:
        self.last_state = state
        self.on_state(state)

    async def create_pod(self, body: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Create the pod (returned as created, with its uid); a pod of the same name still being
        deleted (a restart) is waited for."""
        while True:
            try:
                return await asyncio.to_thread(self.cluster.create_pod, body)
            except ClusterError as error:
                if error.api_status != 409 or time.monotonic() > deadline:
                    raise
            existing = await asyncio.to_thread(self.cluster.read_pod, self.pod)
            labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
            if existing is not None and labels.get(KERNEL_ID_LABEL) != label_value(self.kernel_id):
                raise KernelPodError(f"a pod named {self.pod} exists and is not this kernel's")
            if existing is not None and not existing["metadata"].get("deletionTimestamp"):
                await asyncio.to_thread(self.cluster.delete_pod, self.pod, 0)
            self.say("waiting for the previous pod of this kernel to go")
            await asyncio.sleep(CONFLICT_RETRY)

    async def wait_running(self, timeout: float) -> str:
        """Wait for the pod to run and have an IP (returned); report phase and events; fail with
        the cluster's reason."""
        started = time.monotonic()
        seen: set[str] = set()
        unschedulable_since: float | None = None
        while True:
            pod = await asyncio.to_thread(self.cluster.read_pod, self.pod)
            if pod is None:
                raise KernelPodError(f"the kernel pod {self.pod} was deleted while it started")
            events = await self._events(pod, seen)
            status = pod.get("status") or {}
            phase = status.get("phase") or "Pending"
            ip = status.get("podIP")
            if phase == "Running" and ip:
                self.say(f"running on {(pod.get('spec') or {}).get('nodeName') or '?'} ({ip})")
                return str(ip)
            if phase in ("Succeeded", "Failed"):
                _, reason = termination(pod)
                output = await self.last_output()
                raise KernelPodError(f"the kernel pod {self.pod} ended while starting: {reason}{output}")
            blocked = container_problem(pod)
            if blocked is not None:
                reason, message, image = blocked
                if reason in IMAGE_FAILURES:
                    raise KernelPodError(f"the kernel image {image} cannot be pulled: {reason}: {message}")
                raise KernelPodError(f"the kernel container cannot start: {reason}: {message}")
            unschedulable = unschedulable_reason(pod, events)
            queue = held_by_kueue(pod)
            now = time.monotonic()
            if queue is not None:
                # Waiting for quota, not for a node: the scheduler has not looked at it yet, so
                # the grace does not run; launch_timeout still does.
                unschedulable_since = None
                said = await self._kueue_says(pod)
                self.say(waiting_state(queue, said, await self._kueue_place(pod, queue)))
            elif unschedulable is not None:
                unschedulable_since = unschedulable_since if unschedulable_since is not None else now
                self.say(f"pending: {unschedulable}")
                scaling_up = any(event.get("reason") == "TriggeredScaleUp" for event in events)
                if not scaling_up and now - unschedulable_since >= self.unschedulable_grace:
                    asked = f"asked for {self.asked}" if self.asked else describe_limits(pod)
                    raise DoesNotFitError(
                        f"the cluster cannot place the kernel pod {self.pod} ({asked}): {unschedulable}"
                    )
            else:
                unschedulable_since = None
                self.say(pending_state(pod, events))
            if now - started >= timeout:
                raise KernelPodError(
                    f"the kernel pod {self.pod} did not start within {timeout:g} s "
                    f"(c.GPUShare.launch_timeout); last: {self.last_state}"
                )
            await asyncio.sleep(self.poll_interval)

    async def _kueue_says(self, pod: dict[str, Any]) -> str | None:
        """Kueue's words on why the pod's Workload waits; None where it says nothing yet or they
        cannot be read (no Kueue API, or a Role without ``list workloads``: the plain sentence)."""
        selector = workload_selector(pod)
        if selector is None:
            return None
        workloads = await asyncio.to_thread(self.workloads.list, selector)
        if workloads is None:
            return self.kueue_reason if self.workloads.readable else None
        self.kueue_reason = why_waiting(workloads)
        return self.kueue_reason

    async def _kueue_place(self, pod: dict[str, Any], queue: str) -> Place | None:
        """Where the pod waits in Kueue's queues (its LocalQueue's pending workloads); None where
        that cannot be read (no visibility API, or a Role without ``get
        localqueues/pendingworkloads``)."""
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid or not self.places.readable:
            return None
        places = await asyncio.to_thread(self.places.places, queue)
        if places is not None:
            self.kueue_place = places.get(str(uid))
        return self.kueue_place

    async def say_allocated(self) -> None:
        """Where the pod's claim had fallbacks, say which one the kernel got (GET kernels and
        %gpu status show it too, read from the claim)."""
        if self.claim is None:
            return
        try:
            claim = await asyncio.to_thread(self.cluster.read_claim, self.claim)
        except ClusterError as error:
            self.log.debug("Kernel %s: cannot read its claim: %s", self.kernel_id, error)
            return
        got = allocated_mode(claim or {})
        if got is not None:
            self.log.info("Kernel %s: its claim %s was allocated as %s", self.kernel_id, self.claim, got)
            self.say(f"{self.last_state}; the claim got {got}")

    async def _events(self, pod: dict[str, Any], seen: set[str]) -> list[dict[str, Any]]:
        """This pod's events (not an earlier pod's of the same name), new ones logged."""
        uid = (pod.get("metadata") or {}).get("uid")
        events = [
            event
            for event in await asyncio.to_thread(self.cluster.pod_events, self.pod)
            if not uid or (event.get("involvedObject") or {}).get("uid") in (None, uid)
        ]
        for event in events:
            key = event_key(event)
            if key not in seen:
                seen.add(key)
                self.log.info(
                    "Kernel %s: pod %s: %s: %s",
                    self.kernel_id,
                    self.pod,
                    event.get("reason"),
                    event.get("message"),
                )
        return events

    async def last_output(self) -> str:
        """The kernel container's last lines, to say why it ended (empty when unreadable)."""
        try:
            text = await asyncio.to_thread(self.cluster.pod_log, self.pod)
        except ClusterError as error:
            self.log.debug("Kernel %s: no log: %s", self.kernel_id, error)
            return ""
        text = text.strip()
        return f"; its last output:\n{text}" if text else ""
