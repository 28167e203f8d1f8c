"""``gpushare-provisioner`` for Kubernetes (``c.GPUShare.backend = "kubernetes"``): a pod per kernel.

Kubernetes places the slice, so there is no ledger here: the provisioner builds the pod the
cluster's GPU sharing layer understands (:mod:`jupyter_gpushare.k8s.build`, the same code as
``jupyter gpushare render-pod``), waits honestly, connects securely and cleans up.

Lifecycle (the kernel manager calls these in this order):

* ``pre_launch`` — validate the request (size, mode, cores, per-kernel limit) and build the pod
  and its Secret, so a bad request fails before anything exists in the cluster. The first start
  in a process also collects this server's orphans: pods and Secrets whose creating process is
  gone (a crashed or restarted server).
* ``launch_kernel`` — create the Secret (connection file with the HMAC key and the CurveZMQ
  keys, and the kernel's own-slice token), then the pod; wait for it to run, reporting phase
  and events (``state``, the log, and an ``on_state`` callback a server may pass as the
  ``gpushare_on_state`` start argument). A pod the scheduler cannot place (``FailedScheduling``
  past ``unschedulable_grace``), an image that cannot be pulled, a pod that ends while starting
  or ``launch_timeout`` fail the start with the cluster's reason — and pod and Secret are
  deleted first, so nothing leaks.
* ``poll``/``wait`` — from the pod's phase; a pod that ended reports its exit code, and why
  (``OOMKilled``, ``Evicted``…) in the log and in ``ended_reason``.
* ``send_signal``/``kill``/``terminate`` — pods take no signals: an interrupt goes through the
  control channel (``interrupt_mode = "message"`` is set on the kernelspec), kill and terminate
  delete the pod.
* ``cleanup`` — delete pod and Secret (a restart creates new ones).

Interrupts and encryption need nothing from the kernel manager's configuration: the CurveZMQ
keys travel in the connection info this provisioner returns (jupyter_client >= 8.10 loads them
into the manager, whose clients and the server's websockets then encrypt), and the kernel reads
them from its connection file (ipykernel >= 7.4).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from traitlets import Any as AnyTrait
from traitlets import Float

from ..allocator import kernel_limit_refusal, user_limit_refusal
from ..config import GPUShare, load_settings
from ..errors import ConfigurationError, DoesNotFitError, GPUShareError
from ..k8s.build import cluster_facts, kernel_pod
from ..k8s.cluster import Cluster, ClusterError, load_configuration
from ..k8s.manifests import (
    APP,
    APP_LABEL,
    CONNECTION_FILE,
    HOLDER_ANNOTATION,
    KERNEL_ID_LABEL,
    OWNER_LABEL,
    kernel_ports,
    label_value,
    make_secret,
    pod_name,
    secret_name,
    selector,
)
from ..k8s.pool import held_by_user, read_pod
from ..k8s.presets import resolve_preset
from ..k8s.requests import ClusterFacts, PodRequest, describe
from ..k8s.status import (
    IMAGE_FAILURES,
    container_problem,
    describe_limits,
    event_key,
    pending_state,
    termination,
    unschedulable_reason,
)
from ..processes import current_process, is_alive
from ..records import ProcessIdentity
from ..sizes import MiB, bytes_or_none
from ..slice_request import SliceRequest, make_slice_request
from .base import GPUShareProvisioner

log = logging.getLogger("jupyter_gpushare")

StateCallback = Callable[[str], None]

NODES_CACHED_FOR = 60.0  # seconds the nodes' GPU facts are reused between kernel starts
POD_HOLDERS = " by their kernel pods"  # whose memory a per-user refusal counts
CONFLICT_RETRY = 0.2  # seconds between tries to reuse the name of a pod still being deleted

# Where kernel pods reach the server that runs in this process, to report their GPU use
# ("http://10.1.2.3:8888/user/alice/"); the server extension sets it (a function: the server's
# port is known only once it listens), None outside a server.
_report_base: Callable[[], str | None] | None = None


def set_report_base(base: Callable[[], str | None] | None) -> None:
    global _report_base
    _report_base = base


# Told the kernel id whenever a kernel comes back in a new pod (the server extension makes its
# browsers reconnect); None outside a server.
_new_pod_listener: Callable[[str], object] | None = None


def set_new_pod_listener(listener: Callable[[str], object] | None) -> None:
    global _new_pod_listener
    _new_pod_listener = listener


class KernelPodError(GPUShareError):
    """The kernel pod could not be started; the message carries the cluster's reason."""

    status = 503


def server_identity(settings: GPUShare) -> tuple[str, str]:
    """``(server_id, owner)``: the server id is stable across restarts of one server (same owner,
    same host name — a single-user pod keeps its name), so orphans of a crashed server carry
    this server's label; which process made an object is in its holder annotation."""
    owner = settings.effective_owner()
    return f"{owner}@{socket.gethostname()}", owner


def holder_text(identity: ProcessIdentity) -> str:
    return f"{socket.gethostname()}/{identity.pid}/{identity.start!r}"


def holder_alive(text: str) -> bool:
    """Whether the process named by a holder annotation still runs (unknown hosts count as alive:
    only a process on this host can be judged)."""
    try:
        host, pid, start = text.split("/")
        identity = ProcessIdentity(int(pid), float(start))
    except ValueError:
        return False  # not ours to trust: a malformed holder is an orphan
    if host != socket.gethostname():
        return True
    return is_alive(identity)


@dataclass
class Backend:
    """What kernel pods of one server in one process share: the API client, who we are, the
    nodes' GPU facts, and whether this server's orphans were collected yet."""

    cluster: Cluster
    server_id: str
    owner: str
    holder: str
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _collected: bool = False
    _facts_at: float = -NODES_CACHED_FOR
    _nodes: tuple[tuple[str, ...], int | None] = ((), None)
    # Bytes asked for by this process's starts whose pods may not exist yet (per-user quota).
    _claims: dict[str, int] = field(default_factory=dict)

    def claim(self, owner: str, kernel_id: str, wanted: int, limit: int | None) -> None:
        """Count ``wanted`` bytes against ``owner``'s limit across all their kernel pods (every
        server of theirs in the namespace), or raise with the reason. Held until ``unclaim``."""
        with self._lock:
            if limit is not None:
                listed = self.cluster.list_pods(f"{APP_LABEL}={APP},{OWNER_LABEL}={label_value(owner)}")
                slices = [item for item in map(read_pod, listed) if item is not None]
                counted = {item.kernel_id for item in slices}
                held = held_by_user(slices, owner, excluding=kernel_id) + sum(
                    amount
                    for other, amount in self._claims.items()
                    if other != kernel_id and other not in counted
                )
                refusal = user_limit_refusal(owner, wanted, held, limit, POD_HOLDERS)
                if refusal is not None:
                    raise DoesNotFitError(refusal)
            self._claims[kernel_id] = wanted

    def unclaim(self, kernel_id: str) -> None:
        with self._lock:
            self._claims.pop(kernel_id, None)

    def collect_orphans(self) -> list[str]:
        """Delete this server's pods and Secrets whose creating process is gone (blocking; once)."""
        with self._lock:
            if self._collected:
                return []
            label_selector = selector(self.server_id)
            collected: list[str] = []
            for pod in self.cluster.list_pods(label_selector):
                if not _held(pod):
                    name = pod["metadata"]["name"]
                    self.cluster.delete_pod(name, grace_period_seconds=0)
                    collected.append(f"pod/{name}")
            for secret in self.cluster.list_secrets(label_selector):
                if not _held(secret):
                    name = secret["metadata"]["name"]
                    self.cluster.delete_secret(name)
                    collected.append(f"secret/{name}")
            if collected:
                log.info(
                    "Collected %d orphaned kernel object(s) of server %s (their server process is gone): %s",
                    len(collected),
                    self.server_id,
                    ", ".join(collected),
                )
            self._collected = True
            return collected

    def facts(self, settings: GPUShare) -> ClusterFacts:
        """Cluster facts for pod requests: MIG profiles the nodes advertise and the cards' memory
        (GPU Feature Discovery), cached a minute; the settings alone where nodes cannot be listed."""
        with self._lock:
            if time.monotonic() - self._facts_at >= NODES_CACHED_FOR:
                self._nodes = self._read_nodes(settings)
                self._facts_at = time.monotonic()
            profiles, gpu_memory = self._nodes
        return cluster_facts(settings, profiles, gpu_memory)

    def _read_nodes(self, settings: GPUShare) -> tuple[tuple[str, ...], int | None]:
        try:
            nodes = self.cluster.list_nodes()
        except ClusterError as error:
            log.info("GPU facts from settings only: %s", error)
            return (), None
        prefix = resolve_preset(settings.resource_preset, settings.resource_names).mig_prefix
        profiles: set[str] = set()
        memories: list[int] = []
        for node in nodes:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            for resource, quantity in allocatable.items():
                if resource.startswith(prefix) and str(quantity) not in ("0", ""):
                    profiles.add(resource[len(prefix) :])
            memory = ((node.get("metadata") or {}).get("labels") or {}).get("nvidia.com/gpu.memory")
            if memory and str(memory).isdigit():
                memories.append(int(memory) * MiB)
        # On mixed clusters a share resolves against the smallest card: never more than asked.
        return tuple(sorted(profiles)), (min(memories) if memories else None)


def _held(obj: dict[str, Any]) -> bool:
    holder = ((obj.get("metadata") or {}).get("annotations") or {}).get(HOLDER_ANNOTATION)
    return bool(holder) and holder_alive(str(holder))


_backends: dict[tuple[str, ...], Backend] = {}
_backends_lock = threading.Lock()


def backend_for(settings: GPUShare) -> Backend:
    """This process's backend for these settings (one API client, one orphan collection)."""
    server_id, owner = server_identity(settings)
    identity = current_process()
    key = (os.environ.get("KUBECONFIG", ""), settings.namespace, server_id, str(identity.pid))
    with _backends_lock:
        backend = _backends.get(key)
        if backend is None:
            found = load_configuration()
            cluster = Cluster(settings.namespace or found.namespace, configuration=found.configuration)
            backend = _backends[key] = Backend(cluster, server_id, owner, holder_text(identity))
        return backend


class KubernetesProvisioner(GPUShareProvisioner):
    """A kernel in its own pod, asking the cluster's GPU sharing layer for its slice."""

    gpu_memory = AnyTrait(None, help="Slice size (SPEC §3); None takes GPUShare.default_memory.")
    gpu_mode = AnyTrait(None, help="Sharing mode; None takes GPUShare.default_mode.")
    gpu_cores = AnyTrait(None, help="Percent of SMs, where the mode can limit it.")

    poll_interval = Float(
        0.5, config=True, help="Seconds between reads of a kernel pod while it starts, runs or stops."
    )
    unschedulable_grace = Float(
        10.0,
        config=True,
        help="Seconds a pod the scheduler cannot place may keep waiting before the start fails "
        "with the scheduler's reason (a GPU freed by a pod being deleted, as in a restart, "
        "needs a moment). A cluster autoscaler's scale-up waits for launch_timeout instead.",
    )

    state: str = ""  # what the kernel's pod is doing, as a person reads it
    ended_reason: str | None = None  # why the pod ended: "OOMKilled (exit code 137)"…

    _backend: Backend | None = None
    _settings: GPUShare | None = None
    _launched: bool = False
    _exit_code: int | None = None
    _deleted: bool = False
    _last_read: float = 0.0
    _key: str | None = None
    _curve: tuple[str, str] | None = None
    _manifests: tuple[dict[str, Any], dict[str, Any]] | None = None
    _on_state: StateCallback | None = None
    _pod_ip: str | None = None
    _token: str | None = None  # the kernel's own-slice token (kept across restarts)
    _resized: bool = False  # gpu_memory was changed by resize_to; the start arguments are stale
    _size_before_resize: tuple[object] | None = None  # the size to come back to if a resize fails
    _argv: list[str] = []  # noqa: RUF012 (replaced per start, never mutated)
    resize_failure: str | None = None  # why the last resize did not happen ("the resize to 60G…")
    _generation: int = -1  # how many pods this kernel had before its current one

    # ---- identity ------------------------------------------------------------------------------

    @property
    def pod(self) -> str:
        return pod_name(self.kernel_id)

    @property
    def secret(self) -> str:
        return secret_name(self.kernel_id)

    @property
    def has_process(self) -> bool:
        return self._launched

    @property
    def cluster(self) -> Cluster:
        assert self._backend is not None, "the kernel pod is not prepared (pre_launch)"
        return self._backend.cluster

    # ---- start ---------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        try:
            return await self._prepare(**kwargs)
        except BaseException:
            self.forget_failed_start()
            raise

    async def _prepare(self, **kwargs: Any) -> dict[str, Any]:
        settings = self._settings = load_settings(self.config, reconcile=False)
        for name in ("gpu_memory", "gpu_mode", "gpu_cores"):
            if name in kwargs:
                value = kwargs.pop(name)
                if not (self._resized and name == "gpu_memory"):
                    setattr(self, name, value)
        kwargs.pop("gpushare_path", None)
        self._on_state = kwargs.pop("gpushare_on_state", None)
        self._request(settings)  # a bad request fails before anything is asked of the cluster
        backend = self._backend = await asyncio.to_thread(backend_for, settings)
        await asyncio.to_thread(backend.collect_orphans)
        self._argv = [*self.kernel_spec.argv, *kwargs.pop("extra_arguments", [])]
        self._generation += 1  # every pod of this kernel gets ports of its own (see kernel_ports)
        if self._token is None:
            self._token = secrets.token_urlsafe(24)
        pod_request = await self._build_manifests(settings, backend)
        # Pods take no signals: the kernel manager interrupts through the control channel.
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"] = {}  # the server's environment stays in the server; the pod has its own
        kwargs["cmd"] = self._argv
        # Last, so nothing after it can fail and leave the claim behind (launch_kernel drops it).
        limit = bytes_or_none(settings.max_memory_per_user)
        await asyncio.to_thread(backend.claim, backend.owner, self.kernel_id, pod_request.memory or 0, limit)
        return kwargs

    async def _build_manifests(self, settings: GPUShare, backend: Backend) -> PodRequest:
        """The Secret and pod of this kernel's slice as it stands (``self._manifests``)."""
        request = self._request(settings)
        facts = await asyncio.to_thread(backend.facts, settings)
        base = _report_base() if _report_base is not None else None
        report_url = f"{base}api/gpushare/kernels/{self.kernel_id}/usage" if base else None
        assert self._token is not None
        pod, pod_request = kernel_pod(
            settings,
            kernel_id=self.kernel_id,
            server_id=backend.server_id,
            owner=backend.owner,
            request=request,
            cluster=facts,
            argv=self._argv,
            namespace=backend.cluster.namespace,
            annotations={HOLDER_ANNOTATION: backend.holder},
            report_url=report_url,
            kernel_env=dict(getattr(self.kernel_spec, "env", None) or {}),
            ports=kernel_ports(self._generation),
        )
        secret = make_secret(
            self.kernel_id,
            backend.server_id,
            backend.owner,
            backend.cluster.namespace,
            self._kernel_connection_file(settings),
            self._token,
            annotations={HOLDER_ANNOTATION: backend.holder},
        )
        self._manifests = (secret, pod)
        self.log.info(
            "Kernel %s: pod %s in namespace %s asks for %s",
            self.kernel_id,
            self.pod,
            backend.cluster.namespace,
            describe(pod_request) or "no GPU",
        )
        return pod_request

    def _request(self, settings: GPUShare) -> SliceRequest:
        request = make_slice_request(
            self.gpu_memory,
            self.gpu_mode,
            self.gpu_cores,
            settings.default_memory,
            settings.default_mode,
            settings.min_memory_bytes(),
        )
        if request.size.kind == "bytes":
            refusal = kernel_limit_refusal(
                request.size.resolve(0), bytes_or_none(settings.max_memory_per_kernel)
            )
            if refusal is not None:
                raise DoesNotFitError(refusal)
        return request

    def _kernel_connection_file(self, settings: GPUShare) -> dict[str, Any]:
        """The connection file the kernel reads (it binds every interface of its pod). The keys
        are made once per kernel and kept across restarts, as a local kernel keeps its file."""
        if self._key is None:
            self._key = secrets.token_hex(32)
        if settings.encrypt and self._curve is None:
            import zmq

            if not zmq.has("curve"):
                raise ConfigurationError(
                    "c.GPUShare.encrypt is on but this pyzmq has no CurveZMQ support (libzmq built "
                    "without libsodium): install a pyzmq wheel with it, or set c.GPUShare.encrypt = False"
                )
            public, secret = zmq.curve_keypair()
            self._curve = (public.decode("ascii"), secret.decode("ascii"))
        if not settings.encrypt:
            self._curve = None
        info: dict[str, Any] = {
            "transport": "tcp",
            "ip": "0.0.0.0",
            **{f"{channel}_port": port for channel, port in kernel_ports(self._generation).items()},
            "key": self._key,
            "signature_scheme": "hmac-sha256",
            "kernel_name": str(getattr(self.parent, "kernel_name", "") or ""),
        }
        if self._curve is not None:
            info["curve_publickey"], info["curve_secretkey"] = self._curve
        return info

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        try:
            return await self._launch()
        except DoesNotFitError as error:
            if self._size_before_resize is None or self._settings is None or self._backend is None:
                raise
            # A restart into a new size the cluster cannot place: come back with the size that
            # ran, rather than leave the user without a kernel, and say why.
            wanted, previous = self.gpu_memory, self._size_before_resize[0]
            # It stays "resized": a later restart keeps this size, not the one the start asked for.
            self.gpu_memory, self._size_before_resize = previous, None
            self.resize_failure = f"the resize to {wanted} failed: {error}"
            self.log.warning(
                "Kernel %s: %s; restarting with %s", self.kernel_id, self.resize_failure, previous
            )
            self._set_state(f"resize to {wanted} failed; restarting with the previous size")
            await self._build_manifests(self._settings, self._backend)
            return await self._launch()
        finally:
            self._size_before_resize = None  # the resize is settled, one way or the other

    async def _launch(self) -> KernelConnectionInfo:
        assert self._manifests is not None and self._settings is not None, "pre_launch first"
        secret, pod = self._manifests
        self._exit_code, self.ended_reason, self._deleted, self._pod_ip = None, None, False, None
        try:
            await asyncio.to_thread(self._create_secret, secret)
            await self._create_pod(pod, time.monotonic() + self._settings.launch_timeout)
            self._launched = True
            ip = await self._wait_running(self._settings.launch_timeout)
        except BaseException:
            self._launched = False
            self.forget_failed_start()
            await asyncio.shield(asyncio.to_thread(self._delete_objects))
            raise
        finally:
            if self._backend is not None:
                self._backend.unclaim(self.kernel_id)  # the pod, or nothing, counts from now on
        self._pod_ip = ip
        if self._generation > 0:
            # Once this start has completed: the listener's browsers must find the new pod.
            asyncio.get_running_loop().call_soon(self._tell_new_pod)
        info: KernelConnectionInfo = json.loads(secret["stringData"][CONNECTION_FILE])
        info["ip"] = ip
        # Typed str, but the kernel manager compares it with its own key, which is bytes.
        info["key"] = str(info["key"]).encode()  # type: ignore[typeddict-item]
        self.connection_info = info
        return info

    def _create_secret(self, secret: dict[str, Any]) -> None:
        try:
            self.cluster.create_secret(secret)
        except ClusterError as error:
            if error.api_status != 409:
                raise
            # A Secret of ours from a start that did not finish: replace it.
            self.cluster.delete_secret(self.secret)
            self.cluster.create_secret(secret)

    async def _create_pod(self, pod: dict[str, Any], deadline: float) -> None:
        """Create the pod; a pod of the same name still being deleted (a restart) is waited for."""
        while True:
            try:
                await asyncio.to_thread(self.cluster.create_pod, pod)
                return
            except ClusterError as error:
                if error.api_status != 409 or time.monotonic() > deadline:
                    raise
            existing = await asyncio.to_thread(self.cluster.read_pod, self.pod)
            labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
            if existing is not None and labels.get(KERNEL_ID_LABEL) != label_value(self.kernel_id):
                raise KernelPodError(f"a pod named {self.pod} exists and is not this kernel's")
            if existing is not None and not existing["metadata"].get("deletionTimestamp"):
                await asyncio.to_thread(self.cluster.delete_pod, self.pod, 0)
            self._set_state("waiting for the previous pod of this kernel to go")
            await asyncio.sleep(CONFLICT_RETRY)

    async def _wait_running(self, timeout: float) -> str:
        """Wait for the pod to run and have an IP; report phase and events; fail with the reason."""
        started = time.monotonic()
        seen: set[str] = set()
        unschedulable_since: float | None = None
        while True:
            pod = await asyncio.to_thread(self.cluster.read_pod, self.pod)
            if pod is None:
                raise KernelPodError(f"the kernel pod {self.pod} was deleted while it started")
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
            status = pod.get("status") or {}
            phase = status.get("phase") or "Pending"
            ip = status.get("podIP")
            if phase == "Running" and ip:
                self._set_state(f"running on {(pod.get('spec') or {}).get('nodeName') or '?'} ({ip})")
                return str(ip)
            if phase in ("Succeeded", "Failed"):
                _, reason = termination(pod)
                output = await self._last_output()
                raise KernelPodError(f"the kernel pod {self.pod} ended while starting: {reason}{output}")
            blocked = container_problem(pod)
            if blocked is not None:
                reason, message, image = blocked
                if reason in IMAGE_FAILURES:
                    raise KernelPodError(f"the kernel image {image} cannot be pulled: {reason}: {message}")
                raise KernelPodError(f"the kernel container cannot start: {reason}: {message}")
            unschedulable = unschedulable_reason(pod, events)
            now = time.monotonic()
            if unschedulable is not None:
                unschedulable_since = unschedulable_since if unschedulable_since is not None else now
                self._set_state(f"pending: {unschedulable}")
                scaling_up = any(event.get("reason") == "TriggeredScaleUp" for event in events)
                if not scaling_up and now - unschedulable_since >= self.unschedulable_grace:
                    request = describe_limits(pod)
                    raise DoesNotFitError(
                        f"the cluster cannot place the kernel pod {self.pod} ({request}): {unschedulable}"
                    )
            else:
                unschedulable_since = None
                self._set_state(pending_state(pod, events))
            if now - started >= timeout:
                raise KernelPodError(
                    f"the kernel pod {self.pod} did not start within {timeout:g} s "
                    f"(c.GPUShare.launch_timeout); last: {self.state}"
                )
            await asyncio.sleep(self.poll_interval)

    def _tell_new_pod(self) -> None:
        if _new_pod_listener is not None:
            told = _new_pod_listener(self.kernel_id)
            self.log.info(
                "Kernel %s: back in a new pod; %s browser connection(s) reconnect", self.kernel_id, told
            )

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        self.log.info("Kernel %s: %s", self.kernel_id, state)
        if self._on_state is not None:
            try:
                self._on_state(state)
            except Exception:  # a listener's failure must not fail the start
                self.log.exception("Kernel %s: the state listener failed", self.kernel_id)

    # ---- the kernel's own slice ------------------------------------------------------------------

    def resize_to(self, memory: object) -> None:
        """Use ``memory`` for the kernel's next pod (a pod's resources are fixed: the caller
        restarts the kernel). Validated here, so a bad size changes nothing. If the cluster
        cannot place the new size, the restart comes back with the previous one
        (``resize_failure`` says why)."""
        assert self._settings is not None, "the kernel pod is not prepared (pre_launch)"
        previous = self.gpu_memory
        self.gpu_memory = memory
        try:
            self._request(self._settings)
        except BaseException:
            self.gpu_memory = previous
            raise
        self._resized = True
        self._size_before_resize = (previous,)
        self.resize_failure = None

    def token_matches(self, token: str | None) -> bool:
        """Whether ``token`` is the one this kernel's Secret carries."""
        return bool(token and self._token) and hmac.compare_digest(str(token), str(self._token))

    # ---- running -------------------------------------------------------------------------------

    async def poll(self) -> int | None:
        """None while the pod runs; its kernel's exit code once it ended or is gone."""
        if not self._launched:
            return self._exit_code if self._exit_code is not None else 0
        if self._exit_code is not None:
            return self._exit_code
        if time.monotonic() - self._last_read < self.poll_interval:
            return None
        self._last_read = time.monotonic()
        try:
            pod = await asyncio.to_thread(self.cluster.read_pod, self.pod)
        except ClusterError as error:
            self.log.warning("Kernel %s: cannot read its pod (taken as running): %s", self.kernel_id, error)
            return None
        if pod is None:
            if self._deleted:
                self._exit_code = -signal.SIGKILL
            else:
                self._ended(1, "the kernel pod was deleted by someone else")
            return self._exit_code
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            code, reason = termination(pod)
            output = await self._last_output() if code != 0 else ""
            self._ended(code, reason, output)
            return self._exit_code
        return None

    def _ended(self, code: int, reason: str, output: str = "") -> None:
        if self._exit_code is not None:  # concurrent polls: say it once
            return
        self._exit_code = code
        self.ended_reason = reason
        self._set_state(f"ended: {reason}")
        if code != 0:
            self.log.warning("Kernel %s: pod %s ended: %s%s", self.kernel_id, self.pod, reason, output)

    async def _last_output(self) -> str:
        """The kernel container's last lines, to say why it ended (empty when unreadable)."""
        try:
            text = await asyncio.to_thread(self.cluster.pod_log, self.pod)
        except ClusterError as error:
            self.log.debug("Kernel %s: no log: %s", self.kernel_id, error)
            return ""
        text = text.strip()
        return f"; its last output:\n{text}" if text else ""

    async def wait(self) -> int | None:
        code = 0
        while self._launched:
            polled = await self.poll()
            if polled is not None:
                code = polled
                break
            await asyncio.sleep(self.poll_interval)
        self._launched = False
        return code

    async def send_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            await self._interrupt()
        elif signum == signal.SIGKILL:
            await self.kill()
        elif signum == signal.SIGTERM:
            await self.terminate()
        elif signum != 0:
            self.log.warning(
                "Kernel %s: a pod takes no signal %d; only interrupt, terminate and kill",
                self.kernel_id,
                signum,
            )

    async def _interrupt(self) -> None:
        """An interrupt_request on the control channel (the kernel manager's own way for
        ``interrupt_mode = "message"``, for callers that signal instead)."""
        manager = self.parent
        if manager is None or not self._launched:
            return
        socket_ = manager.connect_control()
        try:
            manager.session.send(socket_, "interrupt_request", {})
        finally:
            socket_.close(linger=1000)

    async def kill(self, restart: bool = False) -> None:
        await self._delete_pod(grace_period_seconds=0)

    async def terminate(self, restart: bool = False) -> None:
        await self._delete_pod(grace_period_seconds=None)

    async def _delete_pod(self, grace_period_seconds: int | None) -> None:
        if self._backend is None:
            return
        self._deleted = True
        await asyncio.to_thread(self.cluster.delete_pod, self.pod, grace_period_seconds)
        self._last_read = 0.0

    async def cleanup(self, restart: bool = False) -> None:
        """Delete pod and Secret; a restart makes new ones from pre_launch."""
        self._launched = False
        if self._backend is not None:
            self._backend.unclaim(self.kernel_id)
            await asyncio.to_thread(self._delete_objects)

    def _delete_objects(self) -> None:
        """Delete pod (at once) and Secret, whatever state they are in (blocking)."""
        self._deleted = True
        problems: list[str] = []
        deletions: list[Callable[[], bool]] = [
            lambda: self.cluster.delete_pod(self.pod, grace_period_seconds=0),
            lambda: self.cluster.delete_secret(self.secret),
        ]
        for delete in deletions:
            try:
                delete()
            except ClusterError as error:
                problems.append(str(error))
        for problem in problems:
            self.log.error("Kernel %s: cleanup incomplete: %s", self.kernel_id, problem)

    # ---- persistence -----------------------------------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info["gpushare"] = {
            "backend": "kubernetes",
            "namespace": self._backend.cluster.namespace if self._backend else None,
            "pod": self.pod,
            "secret": self.secret,
            "pod_ip": self._pod_ip,
            "state": self.state,
            "interrupt_mode": "message",
        }
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        gpushare = provisioner_info.get("gpushare") or {}
        self._pod_ip = gpushare.get("pod_ip")
        self.state = gpushare.get("state") or ""
        self._settings = load_settings(self.config, reconcile=False)
        self._backend = await asyncio.to_thread(backend_for, self._settings)
        self._launched = True


__all__ = [
    "Backend",
    "KernelPodError",
    "KubernetesProvisioner",
    "backend_for",
    "server_identity",
    "set_new_pod_listener",
    "set_report_base",
]
