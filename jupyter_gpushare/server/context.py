"""What the handlers share: the service, the stream, kernel starts, and this server's view."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tornado import web

from ..provisioners import GPUShareProvisioner
from ..service import GPUShareService
from ..views import kernel_view
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
    hub: StreamHub = field(init=False)
    _rendered: dict[str, tuple[Any, str]] = field(default_factory=dict)

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

    def server_kernels(self) -> list[dict[str, Any]]:
        """``GET kernels``: this server's slices, queued and running, and its gpushare kernels
        that run without one (released)."""
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

    def _released_view(self, kernel_id: str) -> dict[str, Any]:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        return {
            "kernel_id": kernel_id,
            "kernel_name": getattr(kernel, "kernel_name", ""),
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
        marker = (self.service.ledger.change_marker(), frozenset(self.kernel_manager.list_kernel_ids()))
        cached = self._rendered.get(name)
        if cached is not None and cached[0] == marker:
            return cached[1]
        text = json.dumps(await asyncio.to_thread(build))
        self._rendered[name] = (marker, text)
        return text

    # ---- snapshots -----------------------------------------------------------------------

    def stream_snapshot(self) -> dict[str, Any]:
        if not self.service.monitor.running:
            self.service.monitor.sample_once()  # keep device figures live with no kernel held
        return {"pool": self.service.pool(), "kernels": self.server_kernels()}

    def metrics_snapshot(self) -> dict[str, Any]:
        return {"pool": self.service.pool(), "kernels": self.service.kernels()}

    @staticmethod
    def openapi_text() -> str:
        return (resources.files("jupyter_gpushare") / "openapi.yaml").read_text()
