"""The live stream behind the panel: one event per sample, fanned out to every subscriber.

Each tick's event is made once whatever the number of subscribers (its text comes from the
snapshot ``GET pool`` and ``GET kernels`` share, rendered once per change), and a new subscriber
gets the latest one at once — which is the whole of a resume after a reconnect, since every
message carries the complete state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("jupyter_gpushare")

QUEUE_DEPTH = 4  # a slow subscriber skips old snapshots instead of growing a backlog


Frame = bytes  # one server-sent event, ``id:``, ``event:`` and ``data:`` lines, as written


def frame(sequence: int, data: str) -> Frame:
    return f"id: {sequence}\nevent: usage\ndata: {data}\n\n".encode()


class StreamHub:
    def __init__(self, event: Callable[[], Awaitable[str]], interval: Callable[[], float]) -> None:
        self._event = event  # the ``data`` of the next event: {"pool": …, "kernels": …}
        self._interval = interval
        self._subscribers: set[asyncio.Queue[Frame]] = set()
        self._task: asyncio.Task[None] | None = None
        self.sequence = 0
        self.latest: Frame | None = None

    def subscribe(self) -> asyncio.Queue[Frame]:
        queue: asyncio.Queue[Frame] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        if self.latest is not None:
            queue.put_nowait(self.latest)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Frame]) -> None:
        self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def tick(self) -> Frame:
        """Make one event and hand it to every subscriber."""
        data = await self._event()
        self.sequence += 1
        self.latest = frame(self.sequence, data)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(self.latest)
        return self.latest

    async def _run(self) -> None:
        while self._subscribers:
            try:
                await self.tick()
            except Exception:  # a transiently locked ledger: keep the stream alive
                log.debug("GPU usage snapshot failed", exc_info=True)
            await asyncio.sleep(self._interval())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._subscribers.clear()
