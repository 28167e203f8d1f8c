"""A server's live view of the broker: the pool and the change marker, pushed as they change.

A server (its REST routes, its panel's stream, its metrics) asks for the pool and for its
kernels many times a second across its users; asking the broker each time would cost the broker
a request per question per server. Instead the server follows the broker's event stream
(``GET stream``): the broker sends the caller's pool and the change marker whenever the marker
changes, and a keep-alive line otherwise. While the feed is live, the pool and the marker are
read from it, and a server's kernels are asked again only when the marker moved; when the feed
breaks (the broker restarts, or goes away), calls go to the broker directly until it is back.

A server reads its own writes: after a change this process made through the broker (a start, a
resize, a release), the feed is not trusted until it has shown a new marker, or until the broker
has looked at the marker twice since (``tick`` each) without a change — then it is current.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.backends.broker_client.transport import BrokerClient
from jupyter_gpushare.core.errors import GPUShareError

log = logging.getLogger("jupyter_gpushare")

KEEP_ALIVE = 15.0  # seconds between the broker's keep-alive lines on an idle stream
RETRY = 1.0  # seconds before following a broken stream again


@dataclass(frozen=True)
class FeedState:
    marker: str
    pool: dict[str, Any]
    received: float  # time.monotonic() when it came


class BrokerFeed:
    """Follows ``GET stream`` in a daemon thread; ``latest()`` is None unless the feed is live."""

    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        self._state: FeedState | None = None
        self._live = False
        self._tick = 1.0  # how often the broker looks at the marker (it says in each event)
        self._changed_at: float | None = None  # a change this process made, not yet seen
        self._changed_from = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="gpushare-broker-feed", daemon=True)

    def start(self) -> BrokerFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> FeedState | None:
        """The broker's latest word; None while the feed is not live, or may not show a change
        this process just made."""
        state = self._state if self._live else None
        changed_at = self._changed_at
        if state is None or changed_at is None:
            return state
        if (state.received > changed_at and state.marker != self._changed_from) or (
            time.monotonic() - changed_at > 2 * self._tick + 0.2
        ):
            self._changed_at = None
            return state
        return None

    def changed_here(self) -> None:
        """This process changed something through the broker: read it back from the broker."""
        state = self._state
        self._changed_from = state.marker if state is not None else ""
        self._changed_at = time.monotonic()

    def pool(self) -> dict[str, Any] | None:
        state = self.latest()
        return copy.deepcopy(state.pool) if state is not None else None

    def _follow(self) -> None:
        problem: str | None = None
        while not self._stop.is_set():
            try:
                for event in self.client.events("stream", timeout=2 * KEEP_ALIVE):
                    if self._stop.is_set():
                        return
                    if event is not None:
                        self._tick = float(event.get("tick") or self._tick)
                        self._state = FeedState(str(event["marker"]), dict(event["pool"]), time.monotonic())
                        self._live = True
                if problem is not None:
                    log.info("jupyter_gpushare: following the GPU broker's stream again")
                problem = None
            except GPUShareError as error:
                if str(error) != problem:
                    log.warning("jupyter_gpushare: the GPU broker's stream broke: %s", error)
                problem = str(error)
            except (KeyError, TypeError, ValueError) as error:
                log.warning("jupyter_gpushare: an unreadable event from the GPU broker: %s", error)
            self._live = False
            self._stop.wait(RETRY)


__all__ = ["KEEP_ALIVE", "BrokerFeed", "FeedState"]
