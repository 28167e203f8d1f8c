"""The broker's change marker (``GET marker`` and every tick of each server's stream): told on
the event loop where the backend can tell it at once, read in a worker thread where it cannot,
and always carrying this broker process's id (a restarted broker's markers never match)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from types import SimpleNamespace
from typing import Any, cast

from jupyter_gpushare.backends.broker_base.handler import BrokerHandler
from jupyter_gpushare.broker.handlers import BROKER_RUN, broker_marker


class Backend:
    """The two marker calls of a backend, as its ledger or watch would answer them."""

    def __init__(self, at_once: Hashable | None) -> None:
        self.at_once = at_once
        self.waited_in: list[threading.Thread] = []

    def change_marker_at_once(self) -> Hashable | None:
        return self.at_once

    def change_marker(self) -> Hashable:
        self.waited_in.append(threading.current_thread())
        return "read-waiting"


def handler_of(backend: Backend) -> BrokerHandler:
    """What ``broker_marker`` uses of a route: its authority's backend and ``run`` (a worker
    thread, as :meth:`BrokerHandler.run`)."""

    async def run(call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(call, *args)

    return cast(BrokerHandler, SimpleNamespace(authority=SimpleNamespace(backend=backend), run=run))


async def test_a_marker_told_at_once_takes_no_worker_thread() -> None:
    backend = Backend(at_once=(7, 2, None))
    assert await broker_marker(handler_of(backend)) == f"{BROKER_RUN}:(7, 2, None)"
    assert backend.waited_in == []


async def test_a_marker_that_cannot_be_told_at_once_is_read_in_a_worker_thread() -> None:
    backend = Backend(at_once=None)
    assert await broker_marker(handler_of(backend)) == f"{BROKER_RUN}:read-waiting"
    [thread] = backend.waited_in
    assert thread is not threading.main_thread()
