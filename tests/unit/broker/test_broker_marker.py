"""The broker's change marker (``GET marker`` and every tick of each server's stream), on a real
local backend (a simulated pool, a ledger in a temporary directory): told on the event loop once
the ledger can tell it at once, read in a worker thread before that, always what the backend's
own ``change_marker`` says, and carrying this broker process's id (a restarted broker's markers
never match)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from jupyter_gpushare.backends.broker_base.handler import BrokerHandler
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.broker.routes import BROKER_RUN, broker_marker
from jupyter_gpushare.config import GPUShare


class Watched(LocalBackend):
    """The local backend, noting the thread of every waiting read of its marker."""

    waited_in: list[threading.Thread]

    def change_marker(self) -> Hashable:
        self.waited_in.append(threading.current_thread())
        return super().change_marker()


def backend_in(directory: Path) -> Watched:
    backend = Watched(GPUShare(simulate="1xA100-80GB", ledger_path=str(directory / "ledger.sqlite")))
    backend.waited_in = []
    return backend


def route_of(backend: LocalBackend) -> BrokerHandler:
    """What ``broker_marker`` uses of a route: its authority's backend, and ``run`` as the
    route's own (a worker thread). A tornado handler needs a request and a server around it."""

    async def run(call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(call, *args)

    return cast(BrokerHandler, SimpleNamespace(authority=SimpleNamespace(backend=backend), run=run))


async def test_a_ledger_not_opened_yet_is_read_in_a_worker_thread(tmp_path: Path) -> None:
    backend = backend_in(tmp_path)
    marker = await broker_marker(route_of(backend))
    [thread] = backend.waited_in
    assert thread is not threading.current_thread()
    assert marker == f"{BROKER_RUN}:{backend.change_marker()}"


async def test_then_the_marker_is_told_on_the_loop_and_moves_with_every_commit(tmp_path: Path) -> None:
    backend = backend_in(tmp_path)
    route = route_of(backend)
    first = await broker_marker(route)  # opens the ledger's watching connection
    backend.waited_in.clear()
    assert await broker_marker(route) == first
    await backend.acquire("kernel-1", backend.check("4G"))
    moved = await broker_marker(route)
    assert moved != first
    assert backend.waited_in == []  # neither read took a worker thread
    assert moved == f"{BROKER_RUN}:{backend.change_marker()}"
