"""Kernel pods started by the broker: one FIFO queue for every user, objects only the broker makes.

A server asks for a kernel pod (``POST pods``); the broker checks the request against its own limits
— per kernel, and per user across every server and every start still waiting, decided under one lock
— builds the pod and its Secret (:mod:`.pod_objects`: the connection file with fresh keys, the
kernel's token), and queues the start. The head of the queue is admitted only when the broker's view
of the cluster (:mod:`jupyter_gpushare.backends.kubernetes.objects.admission`) says it fits; then
the Secret and the pod are created — the only API requests a start costs — and the pod is followed
through the broker's one list+watch. A start alone in the queue that fits is admitted as it comes,
and its objects are created on the thread that took its ``POST`` in, which is answered once they
exist (:meth:`PodStarts.run_start`); the others are admitted by the loop's rounds. The server
asks (``GET pods/{id}``) and gets, in turn, its queue position, the pod's phase and the
scheduler's words, and once it runs the connection info.
A starting kernel's ask is a long one (``?wait=S&seen=MARK``): it is answered when what it would
say differs from the ``mark`` of the caller's last answer, or after ``S`` seconds. Each round
tells the asks of the starts it changed (:meth:`PodStarts.ask`), so a burst of starts costs a
few answers per start, not one every poll interval, and a change is told within a round.

Under a DRA preset each pod also gets a ResourceClaim of its own, built by the embedded
provisioner's pure :func:`~jupyter_gpushare.backends.kubernetes.objects.build.kernel_claim`, created
right after the pod and owned by it (so it goes with it), as a server's own pods get theirs
(:mod:`jupyter_gpushare.backends.kubernetes.kernel_objects`); the nodes admission judges by are the
DRA pool (ResourceSlices and allocated claims, from the same watch), and a claim the scheduler
cannot allocate reaches the server as the scheduler's words, as for any pod it cannot place.

Servers keep asking after their running kernels (their poll, and a lease), so the broker knows
which pods someone still wants. A pod nobody has asked after for ``orphan_grace`` seconds — its
server is gone, or the broker was killed while starting it — is deleted with its Secret: a
restarted broker rebuilds everything else from the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Collection, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_gpushare.backends.kubernetes.backend import POD_HOLDERS, KubernetesBackend
from jupyter_gpushare.backends.kubernetes.broker.kueue_waits import Gated, KueueWaits
from jupyter_gpushare.backends.kubernetes.broker.pod_accounting import PodAccounting
from jupyter_gpushare.backends.kubernetes.broker.pod_objects import (
    PodAsk,
    PodStartState,
    connection_of,
    create_objects,
    delete_objects,
    new_start,
)
from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.kueue_reads import (
    PlaceReader,
    WorkloadReader,
    stopped_by_kueue_events,
)
from jupyter_gpushare.backends.kubernetes.objects.accounted import Accounted, Waiting, accounted
from jupyter_gpushare.backends.kubernetes.objects.admission import Rooms, node_rooms, why_not_now
from jupyter_gpushare.backends.kubernetes.objects.claims import summary
from jupyter_gpushare.backends.kubernetes.objects.kueue import (
    Place,
    held_by_kueue,
    stopped_by_kueue,
    why_waiting_by_pod,
    workloads_selector,
)
from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, held_by_user, never_fits, read_pod
from jupyter_gpushare.backends.kubernetes.objects.starting import CREATED, KernelPodStartError, progress
from jupyter_gpushare.backends.kubernetes.objects.status import termination
from jupyter_gpushare.core.errors import (
    DoesNotFitError,
    GPUShareError,
    InvalidRequestError,
    NoSuchKernelError,
    QueueTimeoutError,
)
from jupyter_gpushare.core.placement.allocator import kernel_limit_refusal, user_limit_refusal
from jupyter_gpushare.core.sizes import bytes_or_none

log = logging.getLogger("jupyter_gpushare.broker")

TICK = 0.1  # seconds between looks at the queue and the starting pods (a new start: at once)
# Kernel pods (and Secrets) created at the same time, each on a thread of its own that also
# takes its POST in (:meth:`PodStarts.start`); threads are made as a burst needs them. A burst's
# starts wait for these threads: with 32, 200 concurrent starts kept the API server below what it
# answers with more in flight (admission p99 x1.3-2.0 a plain client's); with 96, the 97th start
# waited for the first to be created, and the burst's p99 was its second wave's (x1.25 by the
# median of 12 pairs); with 200, one wave (x1.07 by the median of 9; benchmarks/broker_scale.py
# --against-plain, docs/benchmarks.md). The API client's connection pool (cluster.API_CONNECTIONS)
# keeps room for them beside the watches and request threads.
CREATORS = 200
# Seconds a POST pods waits for its pod to be created before it is answered as the start stands
# (an API server slow to create; a caller's call times out at 30 s): from when it came in, or
# once queued if it waited that long for a creator's thread (:meth:`PodStarts.run_start`).
ANSWER_WITHIN = 10.0
UNSCHEDULABLE_GRACE = 10.0  # seconds an admitted pod may stay unplaceable before its start fails
FINISHED_KEPT_FOR = 120.0  # seconds a finished start's outcome stays readable
# Seconds between the broker's reads of the Workloads of the pods Kueue holds: one LIST for all
# of them, not one per pod per round (a round is TICK); Kueue's reason changes when quota does.
KUEUE_EVERY = 1.0
# Seconds between a round's looks at a starting pod that has not changed (its launch timeout,
# the scheduler's grace and Kueue's words): 200 starting pods followed every round cost the
# broker's loop more than the starts' own API requests (benchmarks/broker_scale.py).
FOLLOW_AGAIN = 1.0
KERNEL_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")  # kernel ids become pod names


class PodStarts:
    """Every kernel pod start of the broker's, and the leases of running kernel pods."""

    def __init__(
        self,
        backend: KubernetesBackend,
        *,
        orphan_grace: float = 30.0,
        unschedulable_grace: float = UNSCHEDULABLE_GRACE,
        accounting: PodAccounting | None = None,
    ) -> None:
        self.backend = backend
        self.accounting = accounting
        if accounting is not None:
            accounting.seen_one = self.accounted_one
        self.settings = backend.settings
        self.orphan_grace = orphan_grace
        self.unschedulable_grace = unschedulable_grace
        self.starts: dict[str, PodStartState] = {}
        self.queue: list[str] = []
        self.leases: dict[str, float] = {}
        self.started_at = time.monotonic()
        self.secrets_checked = time.monotonic()
        self._creators = ThreadPoolExecutor(max_workers=CREATORS, thread_name_prefix="gpushare-create")
        # Set when a start is queued: the loop's next round is now, not at its next tick.
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self.lock = threading.RLock()
        # Kueue's reason each pod it holds waits, by the pod's uid (read every KUEUE_EVERY s).
        self.workloads = WorkloadReader(backend.cluster, log)
        self.kueue_says: dict[str, str] = {}
        # Where each pod Kueue holds stands in its queues (its visibility API), by the pod's uid.
        self.places = PlaceReader(backend.cluster, log)
        self.kueue_places: dict[str, Place] = {}
        # How long each of them is expected to wait (needs the accounting's history).
        self.waits = KueueWaits(backend.cluster, accounting)
        self._kueue_read_at = -math.inf
        # Each kernel's pod as last seen: once it is gone, how it ended (Kueue's stop, its uid).
        self.last_pods: dict[str, dict[str, Any]] = {}
        # Long asks: the events the waiting asks about each kernel sleep on (the event loop's
        # alone), and each start's state, queue position and detail as the last round left them.
        self._asks: dict[str, set[asyncio.Event]] = {}
        self._told: dict[str, tuple[str, int, str]] = {}
        # The nodes' rooms for admission, with what they were computed for (:meth:`_rooms`).
        self._round = 0
        self._rooms_for: tuple[tuple[int, Hashable | None], Rooms] | None = None

    @property
    def longest_ask(self) -> float:
        """Seconds between a running pod's reads that keep its lease: a third of ``orphan_grace``
        (the ``renew_within`` its server is told, and the longest a long ask about it waits)."""
        return max(self.orphan_grace / 3, 0.5)

    # ---- what the cluster looks like now (the watch) -----------------------------------------------

    def pods(self) -> dict[str, dict[str, Any]]:
        """Our kernel pods by name, from the broker's watch."""
        return {str((pod.get("metadata") or {}).get("name")): pod for pod in self.backend.pod_objects()}

    # ---- a server asks ------------------------------------------------------------------------------

    def start(
        self, owner: str, server_id: str, ask: PodAsk, admin: bool, submitted: threading.Event
    ) -> dict[str, Any]:
        """``POST pods``: :meth:`submit` ``ask`` (then set ``submitted``); a start admitted at
        once has its objects created here, before its view is read, so that its caller learns in
        the answer that its pod exists. Runs on one of the creators' threads (:meth:`run_start`):
        a burst of starts holds none of the threads other requests are answered on."""
        admitted = self.submit(owner, server_id, ask)
        submitted.set()
        if admitted is not None:
            self._create(admitted)
        # A failed start stays for its caller's next ask, should this answer no longer be awaited.
        return self.view(owner, ask.kernel_id, admin, forget_failed=False)

    async def run_start(self, owner: str, server_id: str, ask: PodAsk, admin: bool = False) -> dict[str, Any]:
        """:meth:`start` on a creator's thread (one thread hand-off for the whole start); its
        view once its pod is created, or ``ANSWER_WITHIN`` seconds after it came in, as it
        stands then (an API server slow to create: the caller's asks follow the start); a start
        that waited that long for a creator's thread, once it is queued.

        Whether the start is queued is a flag the loop reads when its wait ends, not a wake-up:
        in a burst each wake-up of the event loop waits for the interpreter lock behind the
        creators' threads, and every start's answer waits for the loop."""
        submitted = threading.Event()
        started = asyncio.get_running_loop().run_in_executor(
            self._creators, self.start, owner, server_id, ask, admin, submitted
        )
        while True:
            await asyncio.wait({started}, timeout=ANSWER_WITHIN)
            if started.done():
                return started.result()
            if submitted.is_set():
                break
        started.add_done_callback(lambda done: done.exception())  # told by the caller's next ask
        return await asyncio.to_thread(self.view, owner, ask.kernel_id, admin)

    def submit(self, owner: str, server_id: str, ask: PodAsk) -> PodStartState | None:
        """Check ``ask`` against the broker's limits and queue it (raises with the reason). A
        start with nothing ahead of it that fits now is admitted at once, not at the loop's next
        round, and returned: its objects are the caller's to create (:meth:`start`); else None
        (the loop admits it when it fits)."""
        if not KERNEL_ID.match(ask.kernel_id):
            raise InvalidRequestError(
                f"kernel_id must be a lowercase id of letters, digits and dashes, not {ask.kernel_id!r}"
            )
        settings = self.settings
        start = new_start(self.backend, owner, server_id, ask)
        wanted = start.memory
        with self.lock:
            slices = self.backend.slices()
            mine = next((item for item in slices if item.kernel_id == ask.kernel_id), None)
            current = self.starts.get(ask.kernel_id)
            if (mine is not None and mine.owner != owner) or (current is not None and current.owner != owner):
                raise NoSuchKernelError(f"no GPU kernel {ask.kernel_id} of {owner}'s")
            if current is not None and current.active:
                raise InvalidRequestError(f"kernel {ask.kernel_id} is starting already")
            if wanted is not None:
                refusal = kernel_limit_refusal(wanted, bytes_or_none(settings.max_memory_per_kernel))
                refusal = refusal or never_fits(wanted, self.backend.nodes())
                limit = bytes_or_none(settings.max_memory_per_user)
                if refusal is None and limit is not None:
                    visible = {item.kernel_id for item in slices}
                    waiting = sum(
                        other.memory or 0
                        for other in self.starts.values()
                        if other.owner == owner
                        and other.active
                        and other.kernel_id not in visible
                        and other.kernel_id != ask.kernel_id
                    )
                    held = held_by_user(slices, owner, excluding=ask.kernel_id) + waiting
                    refusal = user_limit_refusal(owner, wanted, held, limit, POD_HOLDERS)
                if refusal is not None:
                    raise DoesNotFitError(refusal)
            if settings.when_full == "fail":
                reason = why_not_now(wanted, self.backend.nodes(), slices, self._unseen(_names(slices)))
                if self.queue or reason:
                    raise DoesNotFitError(reason or f"{len(self.queue)} earlier GPU request(s) are waiting")
            self.starts[ask.kernel_id] = start
            self.last_pods.pop(ask.kernel_id, None)
            self.queue.append(ask.kernel_id)
            self.leases[ask.kernel_id] = time.monotonic()
            # Alone in the queue: admitted now if it fits (a round would admit it the same way,
            # one loop wake-up and a thread later: a burst of starts waited for rounds).
            admitted = self._admit() if self.queue == [ask.kernel_id] else []
            if not admitted:
                self._describe_queue()
        if admitted:
            return start
        if self._wake is not None:
            loop, wake = self._wake
            loop.call_soon_threadsafe(wake.set)
        return None

    def view(
        self, owner: str, kernel_id: str, admin: bool = False, *, forget_failed: bool = True
    ) -> dict[str, Any]:
        """How a start (or a running kernel pod) stands, for its server; renews its lease. A
        failed start raises its error, and is forgotten once told (with ``forget_failed``)."""
        with self.lock:
            start = self.starts.get(kernel_id)
            pod = self.backend.pod_object(pod_name(kernel_id))
            if pod is not None:
                self.last_pods[kernel_id] = pod
            last = self.last_pods.get(kernel_id)
            item = read_pod(last) if last is not None else None
            start_owner = start.owner if start is not None else (item.owner if item is not None else None)
            if start_owner is None or not (admin or start_owner == owner):
                raise NoSuchKernelError(f"no GPU kernel {kernel_id} of {owner}'s")
            self.leases[kernel_id] = time.monotonic()
            renew = {"renew_within": self.longest_ask}
            if start is not None and start.state == "starting":
                # As the watch shows the pod now, not as at the loop's last round: a pod that
                # runs is told at once.
                self._follow(start, pod, time.monotonic())
            if start is not None and start.state == "failed":
                error = start.error or KernelPodStartError("the kernel pod could not be started")
                if forget_failed:
                    del self.starts[kernel_id]
                raise error
            if start is not None and start.state == "queued":
                return {
                    "state": "queued",
                    "position": self.queue.index(kernel_id) + 1,
                    "detail": start.detail,
                    **renew,
                }
            if start is not None and start.state in ("creating", "starting"):
                # Behind Kueue's gate: when it is expected to start, where estimated.
                expected = self.waits.expected.get(kernel_id)
                estimate = {"expected_start": expected} if expected is not None else {}
                return {"state": "starting", "detail": start.detail, **estimate, **renew}
            if pod is not None:
                phase = (pod.get("status") or {}).get("phase")
                # A pod Kueue stops (preempted) is deleted right after: its kernel ends now, in
                # Kueue's words.
                if phase in ("Succeeded", "Failed") or stopped_by_kueue(pod) is not None:
                    code, reason = termination(pod)
                    return {"state": "ended", "exit_code": code, "reason": reason, **renew}
                if item is not None and item.deleting:
                    return {
                        "state": "ended",
                        "exit_code": -9,
                        "reason": "the kernel pod is being deleted",
                        **renew,
                    }
                if start is not None and start.state == "running":
                    connection = connection_of(start)
                    return {"state": "running", "detail": start.detail, "connection": connection, **renew}
                return {
                    "state": "running" if phase == "Running" else "starting",
                    "detail": phase or "",
                    **renew,
                }
            assert last is not None  # a start runs only once the watch has shown its pod
        # Gone: as the watch last showed it stopped by Kueue, else as Kueue's event on it says
        # (read outside the lock), else for no known reason.
        said = stopped_by_kueue(last) or self._stopped_in_events(kernel_id, last)
        return {"state": "ended", "exit_code": -9, "reason": said or "the kernel pod is gone", **renew}

    def _stopped_in_events(self, kernel_id: str, pod: dict[str, Any]) -> str | None:
        """Why Kueue stopped ``pod``, from its event (a pod Kueue preempts goes within seconds,
        maybe between two looks of the watch)."""
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return None
        try:
            return stopped_by_kueue_events(self.backend.cluster, pod_name(kernel_id), str(uid))
        except ClusterError as error:
            log.debug("Kernel %s: cannot read its pod's events: %s", kernel_id, error)
            return None

    def delete(self, owner: str, kernel_id: str, grace: int | None, admin: bool = False) -> None:
        """Delete a kernel's pod and Secret, or withdraw its queued start."""
        with self.lock:
            start = self.starts.get(kernel_id)
            pod = self.backend.pod_object(pod_name(kernel_id))
            item = read_pod(pod) if pod is not None else None
            start_owner = start.owner if start is not None else (item.owner if item is not None else None)
            if start_owner is None:
                return  # nothing to delete: deleting twice is no error
            if not (admin or start_owner == owner):
                raise NoSuchKernelError(f"no GPU kernel {kernel_id} of {owner}'s")
            if kernel_id in self.queue:
                self.queue.remove(kernel_id)
                self._describe_queue()
            self.starts.pop(kernel_id, None)
            self.leases.pop(kernel_id, None)
            self.last_pods.pop(kernel_id, None)
            created = start is None or start.state != "queued"
        if created:
            self.delete_objects(kernel_id, grace)

    def account(self) -> None:
        """Write what the accounting keeps now (every housekeeping round; a kernel's cell report
        writes its own first: :meth:`~.pod_accounting.PodAccounting.look_at`)."""
        if self.accounting is not None:
            self.accounting.look(self.accounted)

    def accounted(self) -> dict[str, Accounted]:
        """What the accounting keeps now (:mod:`.pod_accounting`): the kernel pods, and the starts
        waiting for theirs (in the queue, or created but not shown by the watch yet)."""
        with self.lock:
            slices = self.backend.slices()
            requested, waiting = self._waiting(self.starts, _names(slices))
        return accounted(slices, waiting, self.backend.fresh_usage(slices), requested)

    def accounted_one(self, kernel_id: str) -> Accounted | None:
        """:meth:`accounted` of one kernel (None: nothing to keep)."""
        with self.lock:
            pod = self.backend.pod_object(pod_name(kernel_id))
            pods = {pod_name(kernel_id): pod} if pod is not None else {}
            start = self.starts.get(kernel_id)
            requested, waiting = self._waiting({kernel_id: start} if start is not None else {}, set(pods))
        slices = [item for item in map(read_pod, pods.values()) if item is not None]
        return accounted(slices, waiting, self.backend.fresh_usage(slices), requested).get(kernel_id)

    @staticmethod
    def _waiting(
        starts: Mapping[str, PodStartState], pods: Collection[str]
    ) -> tuple[dict[str, float], list[Waiting]]:
        """When each of ``starts`` was asked for (seconds since the epoch), and those still
        waiting for a pod not among ``pods`` (names; in the queue, or created but not seen yet)."""
        wall, now = time.time(), time.monotonic()
        requested = {k: wall - (now - start.requested_at) for k, start in starts.items()}
        waiting = [
            Waiting(kernel_id, start.owner, start.memory, requested[kernel_id])
            for kernel_id, start in starts.items()
            if (start.state in ("queued", "creating") or (start.state == "starting" and not start.seen))
            and pod_name(kernel_id) not in pods
        ]
        return requested, waiting

    def owner_of(self, kernel_id: str) -> str | None:
        with self.lock:
            start = self.starts.get(kernel_id)
            if start is not None:
                return start.owner
        pod = self.backend.pod_object(pod_name(kernel_id))
        item = read_pod(pod) if pod is not None else None
        return item.owner if item is not None else None

    # ---- the broker's loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Admit and follow starts, every ``TICK`` seconds, for the broker's life."""
        await asyncio.to_thread(self.backend.pod_objects)  # the watch's first listing
        wake = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), wake)
        while True:
            wake.clear()  # a start queued from here on wakes the next round early
            try:
                await asyncio.to_thread(self.step)
            except Exception:  # an API hiccup must not end the broker's starts
                log.warning("kernel pod starts: a round failed", exc_info=True)
            with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError's alias from 3.11 on
                await asyncio.wait_for(wake.wait(), TICK)

    def step(self) -> None:
        """One round: admit what fits from the head of the queue (their pods are created in the
        background), then follow starting pods."""
        with self.lock:
            self._round += 1  # the nodes' rooms are computed afresh
            admitted = self._admit() if self.queue else []
        for start in admitted:
            # The API calls of several admitted starts go out together, not one after the
            # other, and the round does not wait for them: it follows the starting pods meanwhile.
            self._creators.submit(self._create, start)
        self._read_kueue()
        with self.lock:
            if any(start.state == "starting" for start in self.starts.values()):
                now = time.monotonic()
                for start in list(self.starts.values()):
                    if start.state != "starting":
                        continue
                    pod = self.backend.pod_object(pod_name(start.kernel_id))
                    last = start.followed
                    if last is not None and last[0] == _version(pod) and now - last[1] < FOLLOW_AGAIN:
                        continue  # nothing new since the last look, and no timer due
                    self._follow(start, pod, now)
            self._forget_finished()
            self._tell_changed()

    # ---- long asks ------------------------------------------------------------------------------

    def ask(self, kernel_id: str) -> asyncio.Event:
        """A new event, set when ``kernel_id``'s start next changes (its state, queue position or
        detail), or goes. Take it on the event loop *before* reading the view an ask compares, so
        a change between the read and the wait is not missed; give it back with
        :meth:`forget_ask` (an ask about a kernel that has no start leaves nothing behind)."""
        event = asyncio.Event()
        self._asks.setdefault(kernel_id, set()).add(event)
        return event

    def forget_ask(self, kernel_id: str, event: asyncio.Event) -> None:
        events = self._asks.get(kernel_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._asks[kernel_id]

    def _tell_changed(self) -> None:
        """Wake the asks of the starts that changed since the last round (lock held)."""
        positions = {kernel_id: position for position, kernel_id in enumerate(self.queue, start=1)}
        now = {
            kernel_id: (start.state, positions.get(kernel_id, 0), start.detail)
            for kernel_id, start in self.starts.items()
        }
        changed = [kernel_id for kernel_id, told in now.items() if self._told.get(kernel_id) != told]
        changed += [kernel_id for kernel_id in self._told if kernel_id not in now]
        self._told = now
        self._tell(changed)

    def _tell(self, kernel_ids: list[str]) -> None:
        """Wake these kernels' asks (from any thread; the change told is made already). Kernels
        nobody asks about cost no wake-up of the event loop (a start just created, whose caller
        has its answer still to come): an ask taken after this look reads the view after the
        change, and answers at once."""
        asked = [kernel_id for kernel_id in kernel_ids if kernel_id in self._asks]
        if asked and self._wake is not None:
            loop, _ = self._wake
            loop.call_soon_threadsafe(self._wake_asks, asked)

    def _wake_asks(self, kernel_ids: list[str]) -> None:
        for kernel_id in kernel_ids:
            for event in self._asks.pop(kernel_id, ()):
                event.set()

    def _admit(self) -> list[PodStartState]:
        """Take from the head of the queue what fits now (lock held)."""
        admitted: list[PodStartState] = []
        now = time.monotonic()
        # Under Kueue, Kueue queues: the pod is made at once and waits behind its gate for
        # quota, which the broker cannot see; a second queue in front would hold starts back.
        rooms = None if self.settings.kueue_queue else self._rooms()
        while self.queue:
            start = self.starts[self.queue[0]]
            waited = now - start.requested_at
            if waited >= self.settings.queue_timeout:
                self.queue.pop(0)
                self._fail(
                    start,
                    QueueTimeoutError(
                        f"no GPU slice after waiting {waited:.0f} s (queue position 1): {start.detail}"
                    ),
                )
                continue
            reason = rooms.why_not(start.memory) if rooms is not None else None
            if reason is not None:
                start.detail = f"waiting for a GPU: position 1 in the queue ({reason})"
                break
            self.queue.pop(0)
            start.state, start.admitted_at = "creating", now
            start.detail = "creating the kernel pod"
            admitted.append(start)
            if start.memory is not None and rooms is not None:
                rooms.take(start.memory)
        self._describe_queue()
        return admitted

    def _read_kueue(self) -> None:
        """Kueue's reasons for the starting pods it holds, and their places in its queues: one
        LIST of their Workloads and one read of each of their LocalQueues' pending workloads, at
        most every ``KUEUE_EVERY`` seconds, outside the lock (a failed read keeps the last ones;
        what cannot be read at all leaves the plain sentence)."""
        now = time.monotonic()
        if now - self._kueue_read_at < KUEUE_EVERY:
            return
        with self.lock:
            gated = [
                Gated(start.kernel_id, start.owner, start.memory or 0, pod)
                for start in self.starts.values()
                if start.state == "starting"
                and (pod := self.backend.pod_object(pod_name(start.kernel_id))) is not None
                and held_by_kueue(pod) is not None
            ]
            held = [one.pod for one in gated]
            uids = {str(uid) for pod in held if (uid := (pod.get("metadata") or {}).get("uid"))}
            queues = {str(held_by_kueue(pod)) for pod in held}
        if not uids:
            self.kueue_says, self.kueue_places = {}, {}
            self.waits.expected = {}
            return
        self._kueue_read_at = now
        places: dict[str, Place] = {}
        for queue in sorted(queues) if self.places.readable else ():
            found = self.places.places(queue)
            if found is None:  # this time (keep the last places), or for good (none)
                kept = self.kueue_places.items() if self.places.readable else ()
                places = {uid: place for uid, place in kept if uid in uids}
                break
            places.update(found)
        with self.lock:
            self.kueue_places = places
            pods = list(self.pods().values())
        self.waits.estimate(gated, pods, places)
        if not self.workloads.readable:
            self.kueue_says = {}
            return
        workloads = self.workloads.list(workloads_selector(uids))
        if workloads is not None:
            said = why_waiting_by_pod(workloads)
            with self.lock:
                self.kueue_says = said
        elif not self.workloads.readable:
            self.kueue_says = {}

    def _rooms(self) -> Rooms:
        """The nodes' rooms (lock held): computed once a round, and between rounds again only
        once the watch has moved; each start admitted meanwhile took its own from them, as in a
        round. A burst of starts admitted as they come (:meth:`submit`) would otherwise read
        every pod and node once per start."""
        key = (self._round, self.backend.change_marker_at_once())  # before what it keys
        if self._rooms_for is None or self._rooms_for[0] != key or key[1] is None:
            slices = self.backend.slices()
            rooms = Rooms(node_rooms(self.backend.nodes(), slices, self._unseen(_names(slices))))
            self._rooms_for = (key, rooms)
        return self._rooms_for[1]

    def _unseen(self, pods: Collection[str]) -> list[int]:
        """Bytes of admitted starts whose pods (by name) are not among ``pods``."""
        return [
            start.memory
            for start in self.starts.values()
            if start.state in ("creating", "starting")
            and start.memory is not None
            and pod_name(start.kernel_id) not in pods
        ]

    def _describe_queue(self) -> None:
        for position, kernel_id in enumerate(self.queue, start=1):
            start = self.starts[kernel_id]
            if position > 1 or not start.detail.startswith("waiting for a GPU: position 1"):
                ahead = position - 1
                behind = f"behind {ahead} earlier GPU request{'s' if ahead > 1 else ''}" if ahead else "next"
                start.detail = f"waiting for a GPU: position {position} in the queue ({behind})"

    def _create(self, start: PodStartState) -> None:
        try:
            create_objects(self.backend, start)
        except ClusterError as error:
            with self.lock:
                self._fail(start, KernelPodStartError(f"the kernel pod could not be created: {error}"))
            self.delete_objects(start.kernel_id, 0)
            return
        with self.lock:
            if start.state != "creating":
                return  # withdrawn meanwhile
            start.state, start.created_at = "starting", time.monotonic()
            start.detail = CREATED
            self._told[start.kernel_id] = (start.state, 0, start.detail)
        self._tell([start.kernel_id])  # created: told now, not at the next round

    def _allocated_as(self, start: PodStartState) -> str | None:
        """Which fallback the running pod's claim got (None: no claim, or not allocated yet)."""
        name = start.claim
        return self.backend.claim_allocated_as(name) if name is not None else None

    def _follow(self, start: PodStartState, pod: dict[str, Any] | None, now: float) -> None:
        """Move a starting pod on from what the watch shows (lock held)."""
        assert start.admitted_at is not None
        start.followed = (_version(pod), now)
        start.seen = start.seen or pod is not None
        if pod is not None:
            self.last_pods[start.kernel_id] = pod
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        # Shown, then gone: deleted. Never shown yet: the watch may lag behind the creation.
        unseen_for = math.inf if start.seen else now - (start.created_at or now)
        seen = progress(
            pod,
            pod_name(start.kernel_id),
            waited=now - start.admitted_at,
            unseen_for=unseen_for,
            unschedulable_for=now - (start.unschedulable_since or now),
            unschedulable_grace=self.unschedulable_grace,
            launch_timeout=self.settings.launch_timeout,
            asked=summary(start.pod_request) if start.pod_request is not None else None,
            kueue_says=self.kueue_says.get(str(uid)) if uid else None,
            kueue_place=self.kueue_places.get(str(uid)) if uid else None,
            kueue_wait=self._expected_wait(start.kernel_id),
        )
        start.unschedulable_since = (start.unschedulable_since or now) if seen.unschedulable else None
        start.detail = seen.detail
        if seen.state == "running":
            start.state, start.ip, start.finished_at = "running", seen.ip, now
            got = self._allocated_as(start)
            if got is not None:
                # As the embedded provisioner says it: the kernel's state tells which fallback.
                log.info("Kernel %s: its claim %s was allocated as %s", start.kernel_id, start.claim, got)
                start.detail = f"{start.detail}; the claim got {got}"
        elif seen.error is not None:
            self._fail(start, seen.error)
            threading.Thread(target=self.delete_objects, args=(start.kernel_id, 0), daemon=True).start()

    def _expected_wait(self, kernel_id: str) -> float | None:
        """Seconds a start Kueue holds is expected to wait still (None: no estimate)."""
        expected = self.waits.expected.get(kernel_id)
        return None if expected is None else expected - time.time()

    def expected_starts(self) -> dict[str, float]:
        """When each kernel whose pod Kueue holds is expected to start (seconds since the
        epoch), where estimated: the ``expected_start`` of its view."""
        return dict(self.waits.expected)

    def _fail(self, start: PodStartState, error: GPUShareError) -> None:
        start.state, start.error, start.finished_at = "failed", error, time.monotonic()
        start.detail = str(error)
        log.info("Kernel %s (%s): the start failed: %s", start.kernel_id, start.owner, error)

    def _forget_finished(self) -> None:
        now = time.monotonic()
        for kernel_id, start in list(self.starts.items()):
            if start.finished_at is not None and now - start.finished_at > FINISHED_KEPT_FOR:
                del self.starts[kernel_id]
        # A gone pod's end is told to its server's next looks; nobody asks after it for longer.
        kept_for = max(self.orphan_grace, FINISHED_KEPT_FOR)
        for kernel_id in [k for k in self.last_pods if now - self.leases.get(k, -math.inf) > kept_for]:
            del self.last_pods[kernel_id]

    def delete_objects(self, kernel_id: str, grace: int | None) -> None:
        """Delete a kernel's pod, Secret and claims; what fails is logged (an orphan sweep or the
        garbage collector finishes it)."""
        for problem in delete_objects(self.backend, kernel_id, grace):
            log.error("Kernel %s: cleanup incomplete: %s", kernel_id, problem)


def _names(slices: list[PodSlice]) -> set[str]:
    return {item.pod for item in slices}


def _version(pod: Mapping[str, Any] | None) -> str | None:
    return str((pod.get("metadata") or {}).get("resourceVersion")) if pod is not None else None


def view_mark(view: Mapping[str, Any]) -> str:
    """A short digest of what an answer says (state, queue position, detail): a long ask waits
    while its view still has the mark of the caller's last answer."""
    said = json.dumps([view.get("state"), view.get("position"), view.get("detail")])
    return hashlib.blake2s(said.encode(), digest_size=8).hexdigest()


__all__ = ["KernelPodStartError", "PodAsk", "PodStartState", "PodStarts", "view_mark"]
