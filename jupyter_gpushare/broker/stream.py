"""``GET stream``: the broker's event stream, which every server on a box follows, and the one
look at the change marker per tick that all of a broker's streams share.

A stream sends the caller's pool whenever the marker moved, and a keep-alive line when nothing
did for ``KEEP_ALIVE`` seconds (:mod:`jupyter_gpushare.backends.broker_client.feed` reads it).
The marker is the same for every caller, so one :class:`MarkerTicks` per broker looks at it once
a tick and wakes the streams only when it moved: with fifty servers on a box that is one read per
tick, not fifty, and an idle stream costs the broker nothing between keep-alives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tornado.iostream import StreamClosedError

from jupyter_gpushare.backends.broker_base.handler import BrokerHandler
from jupyter_gpushare.backends.broker_client.feed import KEEP_ALIVE
from jupyter_gpushare.backends.protocol import Backend
from jupyter_gpushare.core.errors import GPUShareError

STREAM_TICK_MIN, STREAM_TICK_MAX = 0.1, 1.0  # seconds between looks at the marker
BROKER_RUN = uuid.uuid4().hex  # this broker process, in its change markers
log = logging.getLogger("jupyter_gpushare.broker")


async def broker_marker(backend: Backend) -> str:
    """The backend's change marker, with this broker process's id. A restarted broker counts
    afresh, so a server's cached view from before the restart is never taken for current. Told
    on the event loop where the backend can (from memory, or a stat of the ledger: microseconds,
    while a worker thread's hop costs more than the read), else read in one."""
    marker = backend.change_marker_at_once()
    if marker is None:
        marker = await asyncio.to_thread(backend.change_marker)
    return f"{BROKER_RUN}:{marker}"


def stream_tick(backend: Backend) -> float:
    """Seconds between looks at the marker: the pool's sample interval, within bounds."""
    return min(max(backend.settings.sample_interval, STREAM_TICK_MIN), STREAM_TICK_MAX)


class MarkerTicks:
    """The change marker, looked at once every ``interval`` seconds while any stream follows it,
    and the streams woken when it moved (they never look themselves)."""

    def __init__(self, look: Callable[[], Awaitable[str]], interval: float) -> None:
        self._look = look
        self.interval = interval
        self.looks = 0  # looks at the marker so far (what the tests and the benchmark count)
        self._marker: str | None = None  # None until the first look since the ticks began
        self._moved = asyncio.Event()  # set, then replaced, when the marker moves
        self._followers = 0
        self._ticks: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, backend: Backend) -> MarkerTicks:
        return cls(lambda: broker_marker(backend), stream_tick(backend))

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """While a stream is open: the ticks run while anyone follows them."""
        self._followers += 1
        if self._ticks is None or self._ticks.done():
            self._marker = None  # what was looked at before a pause may be old
            self._ticks = asyncio.ensure_future(self._run())
        try:
            yield
        finally:
            self._followers -= 1

    async def after(self, last: str | None, timeout: float) -> str | None:
        """The marker once it is not ``last`` (at once if it already is not), or None if it did
        not move within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._marker is None or self._marker == last:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            moved = self._moved
            try:
                await asyncio.wait_for(moved.wait(), remaining)
            except TimeoutError:
                return None
        return self._marker

    async def _run(self) -> None:
        while self._followers:
            try:
                marker = await self._look()
            except GPUShareError as error:  # the marker cannot be read now: the next tick tries
                log.debug("stream: %s", error)
            else:
                if marker != self._marker:
                    self._marker = marker
                    self._moved.set()
                    self._moved = asyncio.Event()
            finally:
                self.looks += 1
            await asyncio.sleep(self.interval)


class StreamHandler(BrokerHandler):
    """``GET stream``: server-sent events ``{"marker", "pool", "tick"}`` (the caller's view)
    whenever the marker moves, and a keep-alive line every ``KEEP_ALIVE`` seconds otherwise."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        ticks: MarkerTicks = self.settings["marker_ticks"]
        scoped = self.scoped()
        last: str | None = None
        quiet_since = time.monotonic()
        try:
            with ticks.following():
                while True:
                    waited = time.monotonic() - quiet_since
                    marker = await ticks.after(last, max(0.0, KEEP_ALIVE - waited))
                    if marker is not None:
                        try:
                            pool = await self.run(scoped.pool)
                        except GPUShareError as error:  # the pool cannot be read now: try next tick
                            log.debug("stream: %s", error)
                            await asyncio.sleep(ticks.interval)
                        else:
                            self._send({"marker": marker, "pool": pool, "tick": ticks.interval})
                            await self.flush()
                            last, quiet_since = marker, time.monotonic()
                    if time.monotonic() - quiet_since >= KEEP_ALIVE:
                        self.write(": alive\n\n")
                        await self.flush()
                        quiet_since = time.monotonic()
        except StreamClosedError:
            return

    def _send(self, event: dict[str, Any]) -> None:
        self.write(f"data: {json.dumps(event)}\n\n")


__all__ = ["BROKER_RUN", "MarkerTicks", "StreamHandler", "broker_marker", "stream_tick"]
