"""What the handlers share: the service, the stream, kernel starts, and this server's view."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tornado import web

from ..allocator import kernel_limit_refusal, user_limit_refusal
from ..errors import DoesNotFitError, GPUShareError, LedgerError
from ..k8s.pool import never_fits
from ..provisioners import GPUShareProvisioner
from ..provisioners.kubernetes import POD_HOLDERS
from ..service import GPUShareService
from ..sizes import bytes_or_none
from ..slice_request import SliceRequest, make_slice_request
from ..views import kernel_view
from .cluster_pool import ClusterPool
from .starts import Starts
from .stream import StreamHub

PROVISIONER_NAME = "gpushare-provisioner"
START_WAIT_LIMIT = 120.0  # seconds POST waits for a placed kernel's process to come up


@dataclass
class GPUShareContext:
    service: GPUShareService
    kernel_manager: Any
    kernel_spec_manager: Any
    starts: Starts = field(default_factory=Starts)
    cluster: ClusterPool | None = None  # the Kubernetes backend's pool; None for the local one
    hub: StreamHub = field(init=False)
    _rendered: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # (kernelspec, notebook path) of kernels started through POST kernels, for pod kernel views
    started_as: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hub = StreamHub(self.stream_snapshot, lambda: self.service.settings.sample_interval)

    # ---- kernelspecs ---------------------------------------------------------------------

    @staticmethod
    def provisioner_config(spec: Any) -> dict[str, Any] | None:
        """The slice fields of a gpushare kernelspec, or None for any other kernelspec."""
        stanza = (spec.metadata or {}).get("kernel_provisioner") or {}
        if stanza.get("provisioner_name") != PROVISIONER_NAME:
            return None
        return dict(stanza.get("config") or {})

    def gpushare_kernelspecs(self) -> list[str]:
        specs = self.kernel_spec_manager.get_all_specs()
        return sorted(
            name
            for name, entry in specs.items()
            if ((entry.get("spec") or {}).get("metadata") or {})
            .get("kernel_provisioner", {})
            .get("provisioner_name")
            == PROVISIONER_NAME
        )

    def default_kernelspec(self) -> str:
        names = self.gpushare_kernelspecs()
        default = getattr(self.kernel_manager, "default_kernel_name", "")
        if default in names:
            return str(default)
        if not names:
            raise web.HTTPError(
                400, "no gpushare kernelspec is installed; run `jupyter gpushare kernelspec install`"
            )
        return names[0]

    # ---- this server's kernels -----------------------------------------------------------

    def own_kernel_ids(self) -> set[str]:
        return set(self.kernel_manager.list_kernel_ids()) | {s.kernel_id for s in self.starts.pending()}

    def forget_failed_start(self, kernel_id: str) -> None:
        """Drop a failed start from the kernel manager's pending starts.

        jupyter_client keeps a kernel whose start raised in its pending list for ever, and the
        server's shutdown then stalls on it; a refused GPU request must not cost the user a
        hung server. There is no public call for this, hence the private attribute.
        """
        pending = getattr(self.kernel_manager, "_pending_kernels", None)
        if isinstance(pending, dict):
            pending.pop(kernel_id, None)

    def cancel_start(self, kernel_id: str) -> None:
        """Cancel a queued start; its request leaves the queue and the kernel never starts."""
        start = self.starts.get(kernel_id)
        if start is not None and not start.task.done():
            start.task.cancel()
        self.starts.forget(kernel_id)

    def require_own(self, kernel_id: str) -> None:
        if kernel_id not in self.own_kernel_ids():
            raise web.HTTPError(404, f"no kernel {kernel_id} on this server")

    def _is_gpushare_kernel(self, kernel_id: str) -> bool:
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except (KeyError, web.HTTPError):
            return False
        return isinstance(getattr(kernel, "provisioner", None), GPUShareProvisioner)

    def provisioner_of(self, kernel_id: str) -> Any:
        """The provisioner of one of this server's kernels (None when it has none yet)."""
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except (KeyError, web.HTTPError):
            return None
        return getattr(kernel, "provisioner", None)

    def server_kernels(self) -> list[dict[str, Any]]:
        """``GET kernels``: this server's slices, queued and running, and its gpushare kernels
        that run without one (released)."""
        if self.cluster is not None:
            return self._pod_kernels(self.cluster)
        service = self.service
        own = self.own_kernel_ids()
        records = service.ledger.records()
        devices = service.devices()
        queued = [record for record in records if record.state == "queued"]
        positions = {record.kernel_id: index for index, record in enumerate(queued, start=1)}
        views = [
            kernel_view(record, devices, positions.get(record.kernel_id), service.owner)
            for record in records
            if record.kernel_id in own or record.server_id == service.server_id
        ]
        listed = {view["kernel_id"] for view in views}
        for kernel_id in sorted(own - listed):
            if self._is_gpushare_kernel(kernel_id):
                views.append(self._released_view(kernel_id))
        return views

    def _pod_kernels(self, cluster: ClusterPool) -> list[dict[str, Any]]:
        """Kernel pods of this server, with what each start is doing right now."""
        own = self.own_kernel_ids()
        details: dict[str, str] = {}
        names: dict[str, tuple[str, str]] = {}
        for kernel_id in own:
            start = self.starts.get(kernel_id)
            provisioner = self.provisioner_of(kernel_id)
            state = getattr(provisioner, "state", "") if provisioner is not None else ""
            if start is not None:
                names[kernel_id] = (start.kernel_name, start.path)
                state = start.detail or state
            elif kernel_id in self.started_as:
                names[kernel_id] = self.started_as[kernel_id]
            else:
                kernel = self.kernel_manager.get_kernel(kernel_id)
                names[kernel_id] = (str(getattr(kernel, "kernel_name", "")), "")
            if state:
                details[kernel_id] = state
        views = cluster.kernels(own, details, names)
        for view in views:
            failure = getattr(self.provisioner_of(view["kernel_id"]), "resize_failure", None)
            if failure:  # until the next resize: why the kernel still has its old size
                view["warnings"] = [*view["warnings"], f"{failure}; the kernel kept its previous size"]
        listed = {view["kernel_id"] for view in views}
        for kernel_id in sorted(own - listed):
            # No pod (yet, or any more): a start being checked, a restart between two pods, or
            # a pod that ended before the server restarts the kernel.
            start = self.starts.get(kernel_id)
            provisioner = self.provisioner_of(kernel_id)
            if start is None and not isinstance(provisioner, GPUShareProvisioner):
                continue
            kernel_name, path = names.get(kernel_id, ("", ""))
            view = self._preparing_view(kernel_id, kernel_name, path, details.get(kernel_id))
            if getattr(provisioner, "ended_reason", None) and not getattr(provisioner, "has_process", True):
                view["state"] = "released"
            views.append(view)
        return views

    def _preparing_view(
        self, kernel_id: str, kernel_name: str, path: str, detail: str | None
    ) -> dict[str, Any]:
        view = self._released_view(kernel_id, kernel_name)
        view.update(state="queued", path=path, detail=detail or "preparing the kernel pod")
        return view

    def _released_view(self, kernel_id: str, kernel_name: str | None = None) -> dict[str, Any]:
        if kernel_name is None:
            kernel_name = str(getattr(self.kernel_manager.get_kernel(kernel_id), "kernel_name", ""))
        return {
            "kernel_id": kernel_id,
            "kernel_name": kernel_name,
            "path": "",
            "owner": self.service.owner,
            "state": "released",
            "queue_position": None,
            "device": None,
            "mode": None,
            "memory_request": None,
            "size": None,
            "memory_used": 0,
            "utilization": None,
            "usage_source": None,
            "warnings": [],
        }

    def kernel_view(self, kernel_id: str) -> dict[str, Any]:
        start = self.starts.get(kernel_id)
        if start is not None and start.failure is not None:
            raise web.HTTPError(start.failure_status if start.failure_status < 500 else 500, start.failure)
        for view in self.server_kernels():
            if view["kernel_id"] == kernel_id:
                return view
        raise web.HTTPError(404, f"no GPU kernel {kernel_id} on this server")

    async def wait_for_start(self, kernel_id: str, task: asyncio.Future[Any], answer_within: float) -> bool:
        """True once the kernel runs; False if it is still queued after ``answer_within`` s."""
        deadline = time.monotonic() + answer_within
        while not task.done() and self.cluster is not None:
            # A pod is "queued" until it runs: Kubernetes schedules, pulls and starts it.
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        while not task.done():
            record = self.service.ledger.get(kernel_id)
            placed = record is not None and record.state == "running"
            if not placed and time.monotonic() > deadline:
                return False
            if time.monotonic() > deadline + START_WAIT_LIMIT:
                return False
            await asyncio.sleep(0.05)
        return task.exception() is None

    # ---- rendered responses --------------------------------------------------------------

    async def rendered(self, name: str, build: Any) -> str:
        """``build()`` as JSON, reused until the ledger or this server's kernels change.

        Under load most requests then cost a version check instead of reading and rendering
        every slice on the node; any commit (a start, a resize, a sampling round) renews it.
        """
        marker = (
            self._ledger_marker() if self.cluster is None else self.cluster.marker(),
            frozenset(self.kernel_manager.list_kernel_ids()),
            tuple((start.kernel_id, start.detail) for start in self.starts.pending()),
            tuple(sorted(self._pod_states().items())),
        )
        cached = self._rendered.get(name)
        if cached is not None and cached[0] == marker:
            return cached[1]
        text = json.dumps(await asyncio.to_thread(build))
        self._rendered[name] = (marker, text)
        return text

    def _ledger_marker(self) -> object:
        try:
            return self.service.ledger.change_marker()
        except LedgerError:
            return object()  # never equal: a broken ledger is read (and reported) every time

    def _pod_states(self) -> dict[str, str]:
        """What this server's kernel pods are doing (their provisioners' words), for the cache."""
        if self.cluster is None:
            return {}
        states = {}
        for kernel_id in self.kernel_manager.list_kernel_ids():
            state = getattr(self.provisioner_of(kernel_id), "state", None)
            if isinstance(state, str):
                states[kernel_id] = state
        return states

    # ---- the pool ------------------------------------------------------------------------

    def pool(self) -> dict[str, Any]:
        """``GET pool``: a broken ledger is the pool's ``problem`` (the panel's banner), not an error."""
        return self.cluster.pool() if self.cluster is not None else self.service.pool_or_problem()

    def check_request(self, memory: object, mode: object, cores: object, kernel_id: str) -> SliceRequest:
        """Refuse what can never start, before anything starts (bad size or mode, a quota)."""
        if self.cluster is None:
            return self.service.make_request(memory, mode, cores, kernel_id)
        settings = self.service.settings
        request = make_slice_request(
            memory, mode, cores, settings.default_memory, settings.default_mode, settings.min_memory_bytes()
        )
        if request.size.kind == "bytes":
            wanted = request.size.resolve(0)
            too_large = never_fits(wanted, self.cluster.nodes())
            if too_large is not None:
                raise DoesNotFitError(too_large)
            refusal = kernel_limit_refusal(wanted, bytes_or_none(settings.max_memory_per_kernel))
            if refusal is None:
                owner = self.service.owner
                refusal = user_limit_refusal(
                    owner,
                    wanted,
                    self.cluster.held_by_user(owner, excluding=kernel_id),
                    bytes_or_none(settings.max_memory_per_user),
                    POD_HOLDERS,
                )
            if refusal is not None:
                raise DoesNotFitError(refusal)
        return request

    async def resize_pod_kernel(self, kernel_id: str, memory: object, restart: bool) -> None:
        """A pod's resources are fixed: resizing means a new pod, so it needs ``restart``."""
        provisioner = self.provisioner_of(kernel_id)
        if provisioner is None or not hasattr(provisioner, "resize_to"):
            raise web.HTTPError(409, f"kernel {kernel_id} has no kernel pod to resize")
        self.check_request(memory, getattr(provisioner, "gpu_mode", None), None, kernel_id)
        if not restart:
            raise web.HTTPError(
                409,
                "a kernel pod's GPU slice is fixed for the pod's life: nothing was changed. Resize "
                'with a restart: {"gpu_memory": ..., "restart": true} (%gpu resize SIZE --restart)',
            )
        try:
            provisioner.resize_to(memory)
        except GPUShareError as error:
            raise web.HTTPError(409 if error.status == 409 else 400, str(error)) from None
        await self.kernel_manager.restart_kernel(kernel_id)
        if provisioner.resize_failure:
            raise web.HTTPError(
                409, f"{provisioner.resize_failure}; the kernel restarted with its previous size"
            )

    # ---- snapshots -----------------------------------------------------------------------

    def stream_snapshot(self) -> dict[str, Any]:
        try:
            if self.cluster is None and not self.service.monitor.running:
                self.service.monitor.sample_once()  # keep device figures live with no kernel held
            kernels = self.server_kernels()
        except LedgerError:
            kernels = []  # the pool carries the problem
        return {"pool": self.pool(), "kernels": kernels}

    def metrics_snapshot(self) -> dict[str, Any]:
        if self.cluster is not None:
            return {"pool": self.cluster.pool(), "kernels": self.server_kernels()}
        try:
            return {"pool": self.service.pool(), "kernels": self.service.kernels()}
        except LedgerError as error:
            return {"pool": self.service.problem_pool(str(error)), "kernels": []}

    @staticmethod
    def openapi_text() -> str:
        return (resources.files("jupyter_gpushare") / "openapi.yaml").read_text()
