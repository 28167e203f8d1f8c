"""The Kubernetes backend: the cluster's GPU nodes as the pool, kernel pods as the slices.

Kubernetes places each kernel's pod, so there is no ledger here. What the pool looks like comes from
the process's one list+watch of nodes and kernel pods
(:mod:`jupyter_gpushare.backends.kubernetes.cluster.clients`); memory use from the kernels' own
reports (``POST api/gpushare/kernels/{id}/usage``) and, where configured, a HAMi-style monitor's
metrics. The views are built by the pure :mod:`jupyter_gpushare.backends.kubernetes.objects.pool`.
The kernel pod provisioner of the same process shares this object: its API client, the nodes' facts,
the per-user quota across starts, orphan collection.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from jupyter_gpushare.backends.accounting.accounts import Accounts
from jupyter_gpushare.backends.kubernetes.cluster.clients import SharedCluster, shared_cluster
from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError
from jupyter_gpushare.backends.kubernetes.cluster.watch import ClusterWatch
from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts
from jupyter_gpushare.backends.kubernetes.objects.dra_pool import (
    ClaimUse,
    device_views,
    dra_nodes,
    facts_from_slices,
    read_claims,
    read_slices,
    with_allocated_modes,
)
from jupyter_gpushare.backends.kubernetes.objects.holders import holder_text, is_orphan
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    APP,
    APP_LABEL,
    OWNER_LABEL,
    label_value,
    selector,
    server_label,
)
from jupyter_gpushare.backends.kubernetes.objects.pool import (
    PodSlice,
    held_by_user,
    kernel_view,
    never_fits,
    node_modes,
    pool_view,
    queue_positions,
    read_pod,
)
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.backends.kubernetes.objects.preview import preview_pod
from jupyter_gpushare.backends.kubernetes.pod_usage import PodUsage
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.backends.protocol import Accounting, Backend, ServerHooks, ServerKernels
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.capabilities import KERNEL_PODS, Capabilities
from jupyter_gpushare.core.errors import DoesNotFitError, NoAccountingError
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, UsagePayload, UsageRowPayload
from jupyter_gpushare.core.placement.allocator import kernel_limit_refusal, user_limit_refusal
from jupyter_gpushare.core.placement.preview import Preview
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs
from jupyter_gpushare.core.records import UsageReport
from jupyter_gpushare.core.sizes import bytes_or_none
from jupyter_gpushare.core.slice_request import SliceRequest, make_slice_request
from jupyter_gpushare.core.views import slice_less_view

log = logging.getLogger("jupyter_gpushare")

POD_HOLDERS = " by their kernel pods"  # whose memory a per-user refusal counts


def server_identity(settings: GPUShare) -> tuple[str, str]:
    """``(server_id, owner)``: the server id is stable across restarts of one server (same owner,
    same host name — a single-user pod keeps its name), so orphans of a crashed server carry
    this server's label; which process made an object is in its holder annotation."""
    owner = settings.effective_owner()
    return f"{owner}@{socket.gethostname()}", owner


class PodAccounts(Accounting):
    """The accounting of kernel pods: kept by the broker, which sees every user's
    (:mod:`.broker.pod_accounting` sets ``accounts``); a server of its own keeps none."""

    accounts: Accounts | None = None
    viewer: str  # whose figures a report shows (everyone's for an admin)

    def usage(self, since: float, by: str) -> UsagePayload:
        if self.accounts is None:
            raise NoAccountingError(
                "no accounting is kept here: on Kubernetes the GPU broker keeps it "
                "(c.GPUShare.broker_url; see the accounting page of the docs)"
            )
        return self.accounts.report(since, by, self.viewer)

    def usage_totals(self) -> list[UsageRowPayload]:
        return [] if self.accounts is None else self.accounts.total_rows(self.viewer)

    def note_activity(
        self, kernel_id: str, token: str | None, busy: bool, at: float, idle_after: float, idle_action: str
    ) -> None:
        """A kernel pod's cell started or ended (its server, which checked the kernel's token,
        passes it on): busy and idle hours, in the broker's accounting."""
        if self.accounts is not None:
            self.accounts.note_activity(kernel_id, busy, at, idle_after, idle_action)


class KubernetesBackend(PodAccounts, Backend):
    """The cluster as one process sees it (one per process and settings: :func:`kubernetes_backend`)."""

    name = "kubernetes"
    remote_kernels = True
    capabilities: Capabilities = KERNEL_PODS  # a pod holds its resources for its life
    # When kernels whose pods Kueue holds are expected to start, by kernel id: the broker's
    # estimates (:mod:`.broker.kueue_waits` sets it); a server of its own makes none.
    expected_starts: Callable[[], Mapping[str, float]] | None = None

    def __init__(self, settings: GPUShare) -> None:
        self.settings = settings
        self.server_id, self.owner = server_identity(settings)
        self.viewer: str = self.owner  # whose kernels the views show in full (see scoped)
        self.server_label = server_label(self.server_id)
        self.holder = holder_text(current_process())
        self.preset = resolve_preset(settings.resource_preset, settings.resource_names, settings.dra_names())
        self.hooks = ServerHooks()
        self._shared: SharedCluster | None = None
        self._problem: str | None = None  # why there is no cluster
        self._nodes_problem: str | None = None  # why the nodes cannot be read
        self._usage = PodUsage()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._collected = False
        # Bytes asked for by this process's starts whose pods may not exist yet (per-user quota).
        self._claims: dict[str, int] = {}
        self._connect()

    def scoped(self, owner: str, server_id: str, viewer: str) -> KubernetesBackend:
        """This backend as one caller of a broker sees it: ``owner``'s server ``server_id``, views
        as ``viewer`` sees them. Shares the client, the watch and the usage reports."""
        view = copy.copy(self)
        view.owner, view.server_id, view.viewer = owner, server_id, viewer
        view.server_label = server_label(server_id)
        return view

    # ---- cluster access ----------------------------------------------------------------------

    def _connect(self) -> SharedCluster | None:
        if self._shared is None:
            try:
                self._shared = shared_cluster(self.settings.namespace)
                self._problem = None
            except ClusterError as error:
                if str(error) != self._problem:
                    log.warning("jupyter_gpushare: no cluster: %s", error)
                self._problem = str(error)
        return self._shared

    @property
    def cluster(self) -> Cluster:
        """The API client; raises with the reason when no cluster is configured."""
        shared = self._connect()
        if shared is None:
            raise ClusterError(self._problem or "no Kubernetes cluster is configured")
        return shared.cluster

    @property
    def namespace(self) -> str:
        shared = self._connect()
        return shared.namespace if shared is not None else (self.settings.namespace or "?")

    def nodes(self) -> list[NodeGPUs]:
        """The GPU nodes: from the watch in a server, else listed (cached a minute). Under DRA,
        from the driver's ResourceSlices and every allocated ResourceClaim."""
        shared = self._connect()
        if shared is None:
            return []
        try:
            if self.preset.dra is not None:
                devices, uses = self._dra_objects(shared)
                nodes = dra_nodes(devices, uses, self.preset)
            else:
                nodes = shared.gpu_nodes(self.preset)
        except ClusterError as error:  # nodes need a ClusterRole; the pods alone still say a lot
            self._nodes_problem = str(error)
            return []
        self._nodes_problem = None
        return nodes

    def _dra_objects(self, shared: SharedCluster) -> tuple[list[DraDevice], list[ClaimUse]]:
        assert self.preset.dra is not None
        return (
            read_slices(shared.resource_slices(), self.preset.dra),
            read_claims(shared.all_claims(), self.preset.dra),
        )

    def slices(self) -> list[PodSlice]:
        """Our kernel pods, oldest first: from the watch in a server, else listed now."""
        shared = self._connect()
        return shared.kernel_slices() if shared is not None else []

    def pod_objects(self) -> list[dict[str, Any]]:
        """Our kernel pods as the API shows them (from the watch in a server or a broker)."""
        shared = self._connect()
        return [dict(pod) for pod in shared.kernel_pods()] if shared is not None else []

    def pod_object(self, name: str) -> dict[str, Any] | None:
        """One of our kernel pods by name, as :meth:`pod_objects` shows it (None: not there)."""
        shared = self._connect()
        pod = shared.kernel_pod(name) if shared is not None else None
        return dict(pod) if pod is not None else None

    def facts(self) -> ClusterFacts:
        """What pod requests depend on: the MIG profiles the nodes advertise and the cards'
        memory (GPU Feature Discovery, or under DRA the driver's ResourceSlices); the settings
        alone where they cannot be listed."""
        shared = self._connect()
        if self.preset.dra is not None:
            try:
                names = self.preset.dra
                devices = read_slices(shared.resource_slices(), names) if shared is not None else []
            except ClusterError as error:
                log.info("GPU facts from settings only: %s", error)
                devices = []
            profiles, smallest, consumable = facts_from_slices(devices)
            return cluster_facts(self.settings, profiles, smallest, consumable)
        try:
            nodes = shared.gpu_nodes(self.preset) if shared is not None else []
        except ClusterError as error:
            log.info("GPU facts from settings only: %s", error)
            nodes = []
        profiles = sorted({profile for node in nodes for profile in node.mig})
        memories = [node.card_memory for node in nodes if node.card_memory]
        # On mixed clusters a share resolves against the smallest card: never more than asked.
        return cluster_facts(self.settings, profiles, min(memories) if memories else None)

    # ---- the service API (backends.base.Backend) ---------------------------------------------

    def pool(self) -> PoolPayload:
        slices, nodes = self.slices(), self.nodes()
        usage = self.fresh_usage(slices)
        devices = None
        shared = self._shared
        if self.preset.dra is not None and shared is not None and nodes:
            dra_devices, uses = self._dra_objects(shared)
            slices = with_allocated_modes(slices, uses)
            devices = device_views(nodes, dra_devices, uses, slices, self.preset, usage, self.viewer)
        return pool_view(
            nodes, slices, self.preset, usage, viewer=self.viewer, problem=self.problem(), devices=devices
        )

    def claim_allocated_as(self, name: str) -> str | None:
        """The mode ResourceClaim ``name`` was allocated as, from the watch (the broker says it to
        the kernel's server); None without DRA, or while it is not allocated or not seen."""
        shared = self._shared
        if self.preset.dra is None or shared is None:
            return None
        try:
            uses = read_claims(shared.all_claims(), self.preset.dra)
        except ClusterError:
            return None
        return next((use.mode for use in uses if (use.namespace, use.name) == (self.namespace, name)), None)

    def _kernel_slices(self) -> list[PodSlice]:
        """Our kernel pods, with the mode each DRA claim got where it had fallbacks."""
        slices = self.slices()
        shared = self._shared
        if self.preset.dra is None or shared is None:
            return slices
        try:
            return with_allocated_modes(slices, read_claims(shared.all_claims(), self.preset.dra))
        except ClusterError:
            return slices  # the pool's problem says why; the modes asked for stand

    def kernels(self, server: ServerKernels) -> list[KernelPayload]:
        """This server's kernel pods (by label, or by id for kernels this process runs), and its
        kernels without a pod: a start being checked, a restart between two pods, a pod that
        ended before the server restarts the kernel."""
        slices, view_of = self._pod_views()
        views: list[KernelPayload] = []
        for item in slices:
            if item.server != self.server_label and item.kernel_id not in server.ids:
                continue
            if item.ended or item.deleting:
                continue  # its kernel is ending; the server lists it until it is gone
            kernel_name, path = server.name_of(item.kernel_id)
            view = view_of(
                item, kernel_name=kernel_name, path=path, detail=server.details.get(item.kernel_id)
            )
            view["warnings"] = [*view["warnings"], *server.warnings.get(item.kernel_id, ())]
            views.append(view)
        listed = {view["kernel_id"] for view in views}
        for kernel_id in sorted(server.gpushare - listed):
            kernel_name, path = server.name_of(kernel_id)
            ended = kernel_id in server.ended
            views.append(
                slice_less_view(
                    kernel_id,
                    kernel_name=kernel_name,
                    path=path,
                    owner=self.owner,
                    state="released" if ended else "queued",
                    detail=server.details.get(kernel_id) or "preparing the kernel pod",
                )
            )
        return views

    def all_kernels(self) -> list[KernelPayload]:
        slices, view_of = self._pod_views()
        return [view_of(item) for item in slices if not item.ended]

    def _pod_views(self) -> tuple[list[PodSlice], Callable[..., KernelPayload]]:
        """Our kernel pods, and what makes each one's view: the nodes, the usage reports, the
        queue's places and the broker's estimates, read once for all of them."""
        slices, nodes = self._kernel_slices(), self.nodes()
        usage = self.fresh_usage(slices)
        positions = queue_positions(slices)
        expected = self.expected_starts() if self.expected_starts is not None else {}

        def view_of(item: PodSlice, **named: Any) -> KernelPayload:
            return kernel_view(
                item,
                nodes,
                slices,
                usage.get(item.kernel_id),
                viewer=self.viewer,
                positions=positions,
                expected_start=expected.get(item.kernel_id),
                **named,
            )

        return slices, view_of

    def change_marker(self) -> Hashable:
        shared = self._shared
        return self._marker(shared.watch() if shared is not None and shared.watching else None)

    def change_marker_at_once(self) -> Hashable | None:
        """From memory once the watch has listed everything; None while it may still wait for
        its first listing (then ``change_marker`` waits in a worker thread)."""
        shared = self._shared
        if shared is None or not shared.watching:
            return self._marker(None)
        watch = shared.synced_watch()
        return None if watch is None else self._marker(watch)

    def _marker(self, watch: ClusterWatch | None) -> Hashable:
        """The watch's version (-1 without a watch), the usage reports' and the cluster's problem."""
        return (-1 if watch is None else watch.version, self._usage.version, self._problem)

    def modes(self) -> list[str]:
        offered = {mode for node in self.nodes() for mode in node_modes(node, self.preset)}
        return [name for name in MODES if name in offered]

    def check(self, memory: object, mode: object, cores: object, kernel_id: str) -> SliceRequest:
        """Refuse what can never start: a bad request, a size larger than every card the nodes
        advertise, the per-kernel limit, or the per-user limit across the user's kernel pods."""
        settings = self.settings
        request = make_slice_request(
            memory, mode, cores, settings.default_memory, settings.default_mode, settings.min_memory_bytes()
        )
        if request.size.form != "bytes":
            return request
        wanted = request.size.resolve(0)
        refusal = kernel_limit_refusal(wanted, bytes_or_none(settings.max_memory_per_kernel))
        if refusal is None and self._connect() is not None:
            refusal = never_fits(wanted, self.nodes()) or user_limit_refusal(
                self.owner,
                wanted,
                held_by_user(self.slices(), self.owner, excluding=kernel_id),
                bytes_or_none(settings.max_memory_per_user),
                POD_HOLDERS,
            )
        if refusal is not None:
            raise DoesNotFitError(refusal)
        return request

    def preview(self, memory: object, mode: object, cores: object) -> Preview:
        """From the watched nodes and kernel pods: the node a pod would fit on now, its place
        among the pods waiting, or why no node ever could."""
        settings = self.settings
        request = make_slice_request(
            memory, mode, cores, settings.default_memory, settings.default_mode, settings.min_memory_bytes()
        )
        return preview_pod(
            request.size,
            request.mode.name,
            self.owner,
            self.nodes(),
            self.slices(),
            self.preset,
            max_memory_per_kernel=bytes_or_none(settings.max_memory_per_kernel),
            max_memory_per_user=bytes_or_none(settings.max_memory_per_user),
        )

    def is_waiting(self, kernel_id: str) -> bool:
        item = next((item for item in self.slices() if item.kernel_id == kernel_id), None)
        return item is None or not (item.placed and item.phase == "Running")

    def report_usage(self, kernel_id: str, report: UsageReport) -> None:
        self._usage.report(kernel_id, report)

    def refresh(self) -> None:
        """Pods report by themselves, and the metrics reader runs on its own clock."""

    def location(self) -> str:
        return f"kernel pods in namespace {self.namespace}"

    def attach_server(self, hooks: ServerHooks) -> None:
        """A server shows the pool: watch the cluster from now on, and read the metrics."""
        self.hooks = hooks
        shared = self._connect()
        if shared is not None:
            dra = self.preset.dra is not None
            threading.Thread(
                target=lambda: shared.watch(dra=dra), name="gpushare-watch-start", daemon=True
            ).start()
        if self.settings.usage_metrics_url:
            threading.Thread(target=self._read_metrics_forever, name="gpushare-metrics", daemon=True).start()

    def check_access(self) -> None:
        self.cluster  # noqa: B018 (raises ClusterError with the reason when none is configured)

    def problem(self) -> str | None:
        shared = self._shared
        watch_problem = shared.watch().problem if shared is not None and shared.watching else None
        problems = [self._problem, self._nodes_problem, watch_problem, self._usage.problem]
        return "; ".join(problem for problem in problems if problem) or None

    def stop(self) -> None:
        self._stop.set()

    # ---- usage ---------------------------------------------------------------------------------

    def fresh_usage(self, slices: list[PodSlice]) -> dict[str, UsageReport]:
        """Each kernel's latest use: its own fresh report, else the cluster's metrics."""
        return self._usage.fresh(slices)

    def _read_metrics_forever(self) -> None:
        while not self._stop.is_set():
            self.read_metrics()
            self._stop.wait(max(self.settings.sample_interval, 1.0))

    def read_metrics(self) -> None:
        """One read of ``usage_metrics_url`` (a HAMi-style monitor's Prometheus text)."""
        self._usage.read_metrics(
            self.settings.usage_metrics_url, self.namespace, self.settings.usage_metric_names
        )

    # ---- what the kernel pod provisioner of this process shares ---------------------------------

    def claim(self, kernel_id: str, wanted: int) -> None:
        """Count ``wanted`` bytes against the owner's limit across all their kernel pods (every
        server of theirs in the namespace), or raise with the reason. Held until ``unclaim``."""
        limit = bytes_or_none(self.settings.max_memory_per_user)
        with self._lock:
            if limit is not None:
                listed = self.cluster.list_pods(f"{APP_LABEL}={APP},{OWNER_LABEL}={label_value(self.owner)}")
                slices = [item for item in map(read_pod, listed) if item is not None]
                counted = {item.kernel_id for item in slices}
                held = held_by_user(slices, self.owner, excluding=kernel_id) + sum(
                    amount
                    for other, amount in self._claims.items()
                    if other != kernel_id and other not in counted
                )
                refusal = user_limit_refusal(self.owner, wanted, held, limit, POD_HOLDERS)
                if refusal is not None:
                    raise DoesNotFitError(refusal)
            self._claims[kernel_id] = wanted

    def unclaim(self, kernel_id: str) -> None:
        with self._lock:
            self._claims.pop(kernel_id, None)

    def collect_orphans(self) -> list[str]:
        """Delete this server's pods, Secrets and ResourceClaims whose creating process is gone
        (once per process)."""
        with self._lock:
            if self._collected:
                return []
            cluster = self.cluster
            label_selector = selector(self.server_id)
            collected: list[str] = []
            for pod in cluster.list_pods(label_selector):
                if is_orphan(pod):
                    name = pod["metadata"]["name"]
                    cluster.delete_pod(name, grace_period_seconds=0)
                    collected.append(f"pod/{name}")
            for secret in cluster.list_secrets(label_selector):
                if is_orphan(secret):
                    name = secret["metadata"]["name"]
                    cluster.delete_secret(name)
                    collected.append(f"secret/{name}")
            if self.preset.dra is not None:
                # Claims go with their pods (owner references); one whose pod never came is ours.
                for claim in cluster.list_claims(label_selector):
                    if is_orphan(claim):
                        name = claim["metadata"]["name"]
                        cluster.delete_claim(name)
                        collected.append(f"resourceclaim/{name}")
            if collected:
                log.info(
                    "Collected %d orphaned kernel object(s) of server %s (their server process is gone): %s",
                    len(collected),
                    self.server_id,
                    ", ".join(collected),
                )
            self._collected = True
            return collected

    def report_url(self, kernel_id: str) -> str | None:
        """Where kernel ``kernel_id``'s pod reports its use: the server in this process, if any."""
        base = self.hooks.report_base() if self.hooks.report_base is not None else None
        return f"{base}api/gpushare/kernels/{kernel_id}/usage" if base else None

    def new_pod(self, kernel_id: str) -> object:
        """Tell the server in this process that a kernel came back in a new pod."""
        return self.hooks.on_new_pod(kernel_id) if self.hooks.on_new_pod is not None else None


_backends: dict[tuple[str, ...], KubernetesBackend] = {}
_backends_lock = threading.Lock()


def kubernetes_backend(settings: GPUShare) -> KubernetesBackend:
    """This process's Kubernetes backend for these settings (one API client, one watch)."""
    server_id, _ = server_identity(settings)
    key = (os.environ.get("KUBECONFIG", ""), settings.namespace, server_id, str(os.getpid()))
    with _backends_lock:
        backend = _backends.get(key)
        if backend is None:
            backend = _backends[key] = KubernetesBackend(settings)
        else:
            backend.settings = settings  # policy traits may differ between callers; follow the latest
        return backend
