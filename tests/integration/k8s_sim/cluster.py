"""The simulated cluster in a thread: API server and node on their own event loop (as a real API
server is another process), and a kubeconfig pointing at them.

The ``cluster`` fixture (tests/integration/conftest.py) and the tests that need a cluster of
their own enter a :class:`SimulatedCluster`; its helpers read and change the store as a test
does, from any thread (``call``) or from a test's own event loop (``acall``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from .api import ApiServer
from .node import Node
from .nodes import SimNode, hami_nodes
from .resources import EVENTS, PODS, SECRETS

T = TypeVar("T")


class SimulatedCluster:
    """API server and node on their own event loop in a thread; a kubeconfig pointing at them."""

    def __init__(
        self, root: Path, namespace: str = "kernels", nodes: list[SimNode] | None = None, **node_options: Any
    ) -> None:
        self.root = root
        self.namespace = namespace
        self._nodes = nodes if nodes is not None else hami_nodes()
        self._node_options = node_options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="k8s-sim", daemon=True)
        self._stack: contextlib.AsyncExitStack | None = None
        self._node_task: asyncio.Task[None] | None = None
        self.api: ApiServer
        self.node: Node
        self.url = ""
        self.kubeconfig = root / "kubeconfig"

    def __enter__(self) -> SimulatedCluster:
        self._thread.start()
        self.call(self._start)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "test-token"}}],
                    "contexts": [
                        {
                            "name": "sim",
                            "context": {"cluster": "sim", "user": "tester", "namespace": self.namespace},
                        }
                    ],
                    "current-context": "sim",
                }
            )
        )
        return self

    async def _start(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        dra = self._node_options.get("dra") is not None
        self.api = await self._stack.enter_async_context(ApiServer(dra=dra))
        server = await self._stack.enter_async_context(kmock.Server(self.api))
        self.url = str(server.url).rstrip("/")
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        self.node = Node(self.api, self._nodes, self.root / "pods", **self._node_options)
        self._node_task = asyncio.create_task(self.node.run())

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _stop(self) -> None:
        if self._node_task is not None:
            self._node_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._node_task
        await self.node.shutdown()
        if self._stack is not None:
            await self._stack.aclose()

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)

    async def acall(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        """``call`` from a test's own event loop without blocking it."""
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    # -- reading the cluster as a test --

    def objects(self, resource: kmock.resource) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            async with self.api._lock:
                return self.api.items(resource)

        return self.call(read)

    def pods(self) -> list[dict[str, Any]]:
        return self.objects(PODS)

    def created_pods(self) -> list[dict[str, Any]]:
        """Every pod created through the API so far, the deleted ones too, oldest first."""

        async def read() -> list[dict[str, Any]]:
            async with self.api._lock:
                return copy.deepcopy(self.api.created_pods)

        return self.call(read)

    def secrets(self) -> list[dict[str, Any]]:
        return self.objects(SECRETS)

    def events(self, pod: str) -> list[dict[str, Any]]:
        return [event for event in self.objects(EVENTS) if event["involvedObject"]["name"] == pod]

    def add(self, resource: kmock.resource, raw: dict[str, Any]) -> dict[str, Any]:
        async def create() -> dict[str, Any]:
            async with self.api._lock:
                return await self.api.add(resource, raw)

        return self.call(create)

    def remove(self, resource: kmock.resource, namespace: str | None, name: str) -> None:
        async def delete() -> None:
            async with self.api._lock:
                await self.api.remove(resource, namespace, name)

        self.call(delete)

    @property
    def violations(self) -> list[str]:
        return list(self.node.violations)
