"""One rendering of the pool and of this server's kernels per change, shared by every reader.

``GET pool``, ``GET kernels`` and every tick of the live stream answer from the same snapshot
until the backend's change marker or this server's own kernels change. Under load a request
then costs a marker check instead of a read and a render, and a change is read, rendered and
hashed (the ETag) once however many requests and subscribers want it; concurrent requests that
find it stale wait for one build instead of each making their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.core.errors import BackendUnavailableError
from jupyter_gpushare.server.content_coding import compressed


@dataclass(frozen=True)
class Body:
    """A JSON response as it is written: its text, its bytes and their ETag (and, for a large
    one, the same gzip-compressed, made when a client first accepts it)."""

    text: str
    data: bytes
    etag: str  # what tornado would compute for these bytes (a SHA-1), computed once

    # The compressed bytes, made once for every request that wants them (a lock, not a cached
    # property: from Python 3.12 that no longer keeps two threads from both computing it).
    _gzip: list[tuple[bytes, str] | None] = field(default_factory=list, compare=False, repr=False)
    _compressing: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def gzip_ready(self) -> bool:
        """Whether ``gzipped()`` answers at once (else it compresses: a worker thread's job)."""
        return bool(self._gzip)

    def gzipped(self) -> tuple[bytes, str] | None:
        """These bytes gzip-compressed and their own ETag (a coding is a representation of its
        own, RFC 9110 §8.8.3), made on first use; None for a body too small to compress."""
        with self._compressing:
            if not self._gzip:
                data = compressed(self.data)
                self._gzip.append(None if data is None else (data, f'"{hashlib.sha1(data).hexdigest()}"'))
            return self._gzip[0]

    @classmethod
    def of(cls, payload: Any) -> Body:
        return cls.of_text(json.dumps(payload))

    @classmethod
    def of_text(cls, text: str) -> Body:
        data = text.encode()
        return cls(text, data, f'"{hashlib.sha1(data).hexdigest()}"')


Answer = Body | Exception  # what a route answers: a body, or the error it raises


@dataclass(frozen=True)
class Snapshot:
    """The pool and this server's kernels as of one change marker."""

    marker: Hashable
    pool: Answer
    kernels: Answer

    @property
    def complete(self) -> bool:
        return isinstance(self.pool, Body) and isinstance(self.kernels, Body)

    def event(self) -> str:
        """The stream's ``{"pool": …, "kernels": …}``: the text ``json.dumps`` makes of the two
        payloads, without rendering them again. No kernels while the pool is unreadable (the
        pool carries the problem: the panel's banner); any other error is raised."""
        kernels = Body.of([]) if isinstance(self.kernels, BackendUnavailableError) else self.kernels
        if not isinstance(kernels, Body):
            raise kernels
        if not isinstance(self.pool, Body):
            raise self.pool
        return f'{{"pool": {self.pool.text}, "kernels": {kernels.text}}}'


def answer_of(build: Callable[[], Any], render: Callable[[Any], Body] = Body.of) -> Answer:
    try:
        return render(build())
    except Exception as error:  # each route raises its own, as it did when it built alone
        return error


class SharedReads:
    """Reads of a value (the backend's change marker), shared by the requests that arrive while
    none is under way.

    Every request gets a value read after it arrived, so it sees every change made before it
    (a client reads its own writes); but twenty requests arriving together cost one read, not
    twenty. A value ``read_at_once`` can tell (from memory, or a local file in microseconds) is
    read on the event loop, in the loop's next round, for every request that arrived before it;
    otherwise (None) ``read`` is run in a worker thread, since it may block — a hop that costs
    the requests waiting for it far more than such a read.
    """

    def __init__(
        self, read: Callable[[], Hashable], read_at_once: Callable[[], Hashable | None] = lambda: None
    ) -> None:
        self._read = read
        self._read_at_once = read_at_once
        self._next: asyncio.Future[Hashable] | None = None  # the read the next round makes
        self._rounds: asyncio.Task[None] | None = None

    async def value(self) -> Hashable:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            if self._rounds is None or self._rounds.done():
                self._rounds = asyncio.ensure_future(self._run())
        # A request that goes away does not cancel the read the others wait for.
        return await asyncio.shield(self._next)

    async def _run(self) -> None:
        while self._next is not None:
            # Requests arriving from now on wait for the round after this one.
            answer, self._next = self._next, None
            try:
                value = self._read_at_once()
                answer.set_result(await asyncio.to_thread(self._read) if value is None else value)
            except asyncio.CancelledError:
                answer.cancel()
                raise
            except Exception as error:
                answer.set_exception(error)


class Snapshots:
    """The latest snapshot, renewed when the marker changes: the backend's change marker (read
    at once or in a worker thread, see :class:`SharedReads`) and this server's own state of its kernels
    (read on the event loop). ``pool`` and ``kernels`` build the two payloads in a worker thread.
    """

    def __init__(
        self,
        backend_marker: Callable[[], Hashable],
        server_marker: Callable[[], Hashable],
        pool: Callable[[], Any],
        kernels: Callable[[], Any],
        backend_marker_at_once: Callable[[], Hashable | None] = lambda: None,
    ) -> None:
        self._backend_marker = SharedReads(backend_marker, backend_marker_at_once)
        self._server_marker = server_marker
        self._pool = pool
        self._kernels = kernels
        self._latest: Snapshot | None = None
        self._building: asyncio.Lock | None = None
        # Each kernel view's JSON, by the view's identity (the view kept alive beside it).
        self._fragments: dict[int, tuple[Any, str]] = {}
        self.builds = 0  # how many snapshots were built: one per change

    async def _marker(self) -> Hashable:
        return (await self._backend_marker.value(), self._server_marker())

    async def current(self) -> Snapshot:
        """The snapshot for the marker now: the latest one, or one built for it."""
        marker = await self._marker()
        latest = self._latest
        if latest is not None and latest.marker == marker:
            return latest
        if self._building is None:
            self._building = asyncio.Lock()
        waited = self._building.locked()
        async with self._building:
            if waited:
                # Requests that found it stale together wait here for one build; the marker is
                # read again, since the pool may have changed again while they waited.
                marker = await self._marker()
            latest = self._latest
            if latest is not None and latest.marker == marker:
                return latest
            built = await asyncio.to_thread(self.build, marker)
            # One with an error is not kept: the next request tries again.
            self._latest = built if built.complete else None
            return built

    def build(self, marker: Hashable = None) -> Snapshot:
        """Read the pool and the kernels, render them (JSON, bytes, ETag): one snapshot for
        ``marker``. Blocking: :meth:`current` runs it in a worker thread."""
        self.builds += 1
        kernels = answer_of(self._kernels, self._list_body)
        return Snapshot(marker, answer_of(self._pool), kernels)

    def _list_body(self, items: list[Any]) -> Body:
        """``Body.of(items)`` (the same text), each item's JSON reused when the item is the very
        object of the last build: a backend hands out the same view again for a slice that did
        not change, and views are never changed once handed out (``Backend.kernels``)."""
        known, kept, parts = self._fragments, {}, []
        for item in items:
            hit = known.get(id(item))
            text = hit[1] if hit is not None and hit[0] is item else json.dumps(item)
            kept[id(item)] = (item, text)
            parts.append(text)
        self._fragments = kept
        return Body.of_text(f"[{', '.join(parts)}]")
