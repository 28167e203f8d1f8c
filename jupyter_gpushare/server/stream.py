"""The live stream behind the panel: one snapshot per sample, fanned out to every subscriber.

The snapshot is built once per tick whatever the number of subscribers, and a new subscriber
gets the latest one at once — which is the whole of a resume after a reconnect, since every
message carries the complete state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from ..payloads import StatusPayload

log = logging.getLogger("jupyter_gpushare")

QUEUE_DEPTH = 4  # a slow subscriber skips old snapshots instead of growing a backlog


class StreamHub:
    def __init__(self, snapshot: Callable[[], StatusPayload], interval: Callable[[], float]) -> None:
        self._snapshot = snapshot
        self._interval = interval
        self._subscribers: set[asyncio.Queue[tuple[int, str]]] = set()
        self._task: asyncio.Task[None] | None = None
        self.sequence = 0
        self.latest: tuple[int, str] | None = None

    def subscribe(self) -> asyncio.Queue[tuple[int, str]]:
        queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        if self.latest is not None:
            queue.put_nowait(self.latest)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[int, str]]) -> None:
        self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def tick(self) -> tuple[int, str]:
        """Build one snapshot and hand it to every subscriber."""
        data = await asyncio.to_thread(self._snapshot)
        self.sequence += 1
        self.latest = (self.sequence, json.dumps(data))
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
