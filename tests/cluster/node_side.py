"""The node side of the test cluster: what no control plane does, on its own event loop in a
thread (as kubelets are other processes).

:class:`NodeSide` registers its :class:`~.nodes.SimNode`\\ s, each as the node's own identity
(``system:node:NAME`` in ``system:nodes``: the real Node authorizer and NodeRestriction admission
decide what it may read and write, as for a kubelet), renews their Leases, publishes a DRA
driver's ResourceSlices (as each node) and DeviceClasses (as the administrator, as a driver's
chart does), serves pod logs (kubelet_server.py), and runs the pods the real scheduler binds to
its nodes (kubelet.py): one list+watch of each node's pods, as kubelet keeps one. On
:meth:`~NodeSide.stop` it deletes what it made (pods on its nodes, slices, classes, Leases,
Nodes), so the next test's nodes can take the same names.

It is ready once the node-lifecycle controller has lifted the ``not-ready`` taint every new Node
gets, and the real scheduler has placed a pod on the node that changed last (a "canary" pod,
deleted at once): the scheduler's view of the cluster has the new nodes, schedulable.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from .controlplane import ControlPlane
from .dra_devices import DraDriver
from .kubelet import Kubelet, Running
from .kubelet_server import KubeletServer
from .nodes import RENEW_SECONDS, SimNode, micro_timestamp
from .rest import DEVICE_CLASSES, LEASES, NODES, PODS, RESOURCE_SLICES, ApiError, AsyncApi

T = TypeVar("T")
CANARY_LABEL = "jupyter-gpushare.io/test-canary"
NOT_READY = "node.kubernetes.io/not-ready"
READY_TIMEOUT = 120.0


class NodeSide:
    """Simulated GPU nodes of the cluster ``control_plane`` runs, working in ``workdir``."""

    def __init__(
        self,
        control_plane: ControlPlane,
        nodes: list[SimNode],
        workdir: Path,
        *,
        driver: DraDriver | None = None,
        broken_images: Iterable[str] = (),
        record_namespace: str | None = None,
        lease_renewal: float = RENEW_SECONDS,
    ) -> None:
        self.control_plane = control_plane
        self.nodes = nodes
        self.workdir = workdir
        self.driver = driver
        self.broken_images = list(broken_images)
        self.record_namespace = record_namespace
        self.lease_renewal = lease_renewal  # seconds between a Lease's renewals
        self.violations: list[str] = []  # what a real cluster would refuse, or an error of ours
        self.created: list[dict[str, Any]] = []  # pods of record_namespace as created
        self.kubelet: Kubelet
        self._apis: dict[str, AsyncApi] = {}
        self._admin: AsyncApi | None = None
        self._server: KubeletServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="node-side", daemon=True)

    # -- what tests read and do ---------------------------------------------------------------------

    @property
    def running(self) -> dict[str, Running]:
        """The pods whose containers run, by uid."""
        return self.kubelet.running

    @property
    def logs(self) -> dict[str, Path]:
        """Each pod's container output, by pod name."""
        return self.kubelet.logs

    async def oom_kill(self, name: str) -> None:
        """The kernel of pod ``name`` killed as the OOM killer does (run with :meth:`call`)."""
        await self.kubelet.oom_kill(name)

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        """Run a coroutine on the node side's loop, from any thread."""
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)

    async def acall(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        """:meth:`call` from a test's own event loop without blocking it."""
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    # -- life -----------------------------------------------------------------------------------------

    def start(self) -> NodeSide:
        self._thread.start()
        try:
            self.call(self._start, timeout=READY_TIMEOUT + 60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.call(self._stop, timeout=120)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> NodeSide:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        plane = self.control_plane
        self._admin = AsyncApi(plane.admin_identity)
        for node in self.nodes:
            identity = plane.certificate_identity(f"system:node:{node.name}", ["system:nodes"], node.name)
            self._apis[node.name] = AsyncApi(identity)
        self.kubelet = Kubelet(
            self._apis,
            self.workdir / "pods",
            self.violations,
            self.broken_images,
            self.driver.devices() if self.driver else None,
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._server = KubeletServer(
            lambda namespace, pod: self.kubelet.log_paths.get((namespace, pod)),
            plane.authority.serving_certificate(),
            plane.ca,
            self.workdir / "kubelet-pki",
        )
        if self.driver is not None:
            for device_class in self.driver.classes:
                await self._admin.apply(device_class, field_manager="dra-driver-chart")
            # The slices before the nodes: once the scheduler knows a node, it knows its devices.
            for piece in self.driver.slices:
                await self._apis[piece["spec"]["nodeName"]].create(RESOURCE_SLICES, piece)
        for node in self.nodes:
            await self._register(node)
        for node in self.nodes:
            self._tasks.append(asyncio.create_task(self._reflect(node.name), name=f"pods-{node.name}"))
        if self.record_namespace:
            self._tasks.append(asyncio.create_task(self._record(self.record_namespace), name="record"))
        if self.nodes:  # none: a test of the real node alone (real_node.py)
            await self._canary()

    async def _register(self, node: SimNode) -> None:
        """The Node, as its kubelet registers it, and its Lease, renewed from now on."""
        api = self._apis[node.name]
        manifest = node.manifest(self._server.port if self._server else 10250, self._version())
        try:
            created = await api.create(NODES, manifest)
        except ApiError as error:
            if error.status != 409:
                raise
            # A node of that name left by a test run that was killed: gone, then ours.
            assert self._admin is not None
            await self._admin.delete(NODES, node.name, grace=0)
            created = await api.create(NODES, manifest)
        lease = node.lease(created["metadata"]["uid"])
        try:
            lease = await api.create(LEASES, lease)
        except ApiError as error:
            if error.status != 409:
                raise
            current = await api.get(LEASES, node.name, "kube-node-lease")
            assert current is not None
            current["spec"] = lease["spec"]
            current["metadata"]["ownerReferences"] = lease["metadata"]["ownerReferences"]
            lease = await api.replace(LEASES, current)
        self._tasks.append(asyncio.create_task(self._heartbeat(node.name, lease), name=f"lease-{node.name}"))

    def _version(self) -> str:
        return self.control_plane.version or "v1.34.0"

    async def _heartbeat(self, node: str, lease: dict[str, Any]) -> None:
        """Renew the node's Lease every ``lease_renewal`` seconds (kubelet: 10): the node-lifecycle
        controller marks a node whose Lease goes stale NotReady and taints it."""
        api = self._apis[node]
        while True:
            await asyncio.sleep(self.lease_renewal)
            renewed = copy.deepcopy(lease)
            renewed["spec"]["renewTime"] = micro_timestamp()
            try:
                lease = await api.replace(LEASES, renewed)
            except ApiError as error:
                if error.status == 404:
                    renewed["metadata"].pop("resourceVersion", None)
                    lease = await api.create(LEASES, renewed)
                elif error.status == 409:
                    lease = await api.get(LEASES, node, "kube-node-lease") or lease
                else:
                    self.violations.append(f"lease of {node}: {error}")
            except httpx.HTTPError:
                pass  # the API server is away (a test restarts it): renew on the next beat

    async def _reflect(self, node: str) -> None:
        """List and watch the pods bound to ``node`` and hand every version to the kubelet;
        list again whenever the watch ends (its timeout, ``410 Gone``, an API server away)."""
        api = self._apis[node]
        selector = f"spec.nodeName={node}"
        known: set[str] = set()
        while True:
            try:
                listing = await api.list(PODS, field_selector=selector)
                present = {pod["metadata"]["uid"]: pod for pod in listing["items"]}
                for uid in known - present.keys():
                    await self.kubelet.forget(uid)
                known = set(present)
                for pod in present.values():
                    await self.kubelet.sync(node, pod)
                version = listing["metadata"]["resourceVersion"]
                async for event in api.watch(PODS, version, field_selector=selector):
                    kind, pod = event["type"], event["object"]
                    if kind == "ERROR":
                        break  # 410 Gone: list again
                    if kind == "BOOKMARK":
                        continue
                    uid = pod["metadata"]["uid"]
                    if kind == "DELETED":
                        known.discard(uid)
                        await self.kubelet.forget(uid)
                    else:
                        known.add(uid)
                        await self.kubelet.sync(node, pod)
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ApiError):
                await asyncio.sleep(0.5)  # the API server is away or restarting: try again

    async def _record(self, namespace: str) -> None:
        """Every pod created in ``namespace`` while the node side runs, as created."""
        assert self._admin is not None
        while True:
            try:
                listing = await self._admin.list(PODS, namespace)
                version = listing["metadata"]["resourceVersion"]
                async for event in self._admin.watch(PODS, version, namespace):
                    if event["type"] == "ADDED":
                        self.created.append(event["object"])
                    elif event["type"] == "ERROR":
                        break
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ApiError):
                await asyncio.sleep(0.5)

    async def _ready(self) -> str:
        """Wait until the node-lifecycle controller has lifted the ``not-ready`` taint that
        admission (TaintNodesByCondition) puts on every new Node, as for a kubelet's; return the
        node changed last."""
        assert self._admin is not None
        names = {node.name for node in self.nodes}
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            nodes = [
                node for node in (await self._admin.list(NODES))["items"] if node["metadata"]["name"] in names
            ]
            tainted = [
                node["metadata"]["name"]
                for node in nodes
                if any(taint["key"] == NOT_READY for taint in node["spec"].get("taints") or [])
            ]
            if len(nodes) == len(names) and not tainted:
                latest = max(nodes, key=lambda node: int(node["metadata"]["resourceVersion"]))
                return str(latest["metadata"]["name"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes still tainted {NOT_READY} after {READY_TIMEOUT:.0f} s: {tainted}")
            await asyncio.sleep(0.1)

    async def _canary(self) -> None:
        """Wait until the nodes are ready and the real scheduler has placed a pod on the node that
        changed last (its view of the nodes, one watch in order, then holds them all), then
        delete that pod."""
        assert self._admin is not None
        last = await self._ready()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "node-canary-",
                "namespace": "default",
                "labels": {CANARY_LABEL: "true"},
            },
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": last},
                "containers": [{"name": "canary", "image": "canary", "command": ["true"]}],
                "terminationGracePeriodSeconds": 0,
                "restartPolicy": "Never",
            },
        }
        created = await self._admin.create(PODS, pod)
        name = created["metadata"]["name"]
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while True:
                current = await self._admin.get(PODS, name, "default")
                if current is not None and current["spec"].get("nodeName"):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the scheduler placed no pod on {last} within {READY_TIMEOUT:.0f} s")
                await asyncio.sleep(0.05)
        finally:
            await self._admin.delete(PODS, name, "default", grace=0)

    async def _stop(self) -> None:
        admin = self._admin
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if admin is not None:
            for node in self.nodes:  # pods left on the nodes go with them
                with contextlib.suppress(ApiError, httpx.HTTPError):
                    listing = await admin.list(PODS, field_selector=f"spec.nodeName={node.name}")
                    for pod in listing["items"]:
                        metadata = pod["metadata"]
                        await admin.delete(PODS, metadata["name"], metadata["namespace"], grace=0)
        if hasattr(self, "kubelet"):
            await self.kubelet.shutdown()
        if admin is not None:
            with contextlib.suppress(ApiError, httpx.HTTPError):
                for piece in self.driver.slices if self.driver else []:
                    await admin.delete(RESOURCE_SLICES, piece["metadata"]["name"])
                for device_class in self.driver.classes if self.driver else []:
                    await admin.delete(DEVICE_CLASSES, device_class["metadata"]["name"])
                for node in self.nodes:
                    await admin.delete(LEASES, node.name, "kube-node-lease")
                    await admin.delete(NODES, node.name)
        for api in [*self._apis.values(), *([admin] if admin else [])]:
            await api.close()
        if self._server is not None:
            self._server.close()
