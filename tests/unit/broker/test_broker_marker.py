"""The broker's change marker (``GET marker`` and every tick of each server's stream), on a real
local backend (a simulated pool, a ledger in a temporary directory): told on the event loop once
the ledger can tell it at once, read in a worker thread before that, always what the backend's
own ``change_marker`` says, and carrying this broker process's id (a restarted broker's markers
never match)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from pathlib import Path

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.broker.stream import BROKER_RUN, MarkerTicks, broker_marker
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import BackendUnavailableError


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


async def test_a_ledger_not_opened_yet_is_read_in_a_worker_thread(tmp_path: Path) -> None:
    backend = backend_in(tmp_path)
    marker = await broker_marker(backend)
    [thread] = backend.waited_in
    assert thread is not threading.current_thread()
    assert marker == f"{BROKER_RUN}:{backend.change_marker()}"


async def test_then_the_marker_is_told_on_the_loop_and_moves_with_every_commit(tmp_path: Path) -> None:
    backend = backend_in(tmp_path)
    first = await broker_marker(backend)  # opens the ledger's watching connection
    backend.waited_in.clear()
    assert await broker_marker(backend) == first
    await backend.acquire("kernel-1", backend.check("4G"))
    moved = await broker_marker(backend)
    assert moved != first
    assert backend.waited_in == []  # neither read took a worker thread
    assert moved == f"{BROKER_RUN}:{backend.change_marker()}"


# ---- one look per tick for every stream ----------------------------------------------------------


class Counted(Watched):
    """Also counts the looks told at once (what a stream's tick costs once the ledger is open)."""

    told: int

    def change_marker_at_once(self) -> Hashable | None:
        self.told += 1
        return super().change_marker_at_once()


async def follow(ticks: MarkerTicks, seen: list[str], stop: asyncio.Event) -> None:
    """What a stream does with the ticks: wait for each move, note it."""
    with ticks.following():
        last: str | None = None
        while not stop.is_set():
            marker = await ticks.after(last, 0.2)
            if marker is not None:
                seen.append(marker)
                last = marker


async def test_many_streams_share_one_look_per_tick_and_each_sees_every_move(tmp_path: Path) -> None:
    backend = Counted(GPUShare(simulate="1xA100-80GB", ledger_path=str(tmp_path / "ledger.sqlite")))
    backend.waited_in, backend.told = [], 0
    ticks = MarkerTicks(lambda: broker_marker(backend), 0.05)
    stop = asyncio.Event()
    seen: list[list[str]] = [[] for _ in range(30)]
    streams = [asyncio.ensure_future(follow(ticks, own, stop)) for own in seen]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not all(seen) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert all(seen), "a stream never had its first marker"
    first = seen[0][0]
    looks_before, told_before = ticks.looks, backend.told
    await asyncio.sleep(0.5)  # about ten ticks with nothing changing
    looks = ticks.looks - looks_before
    assert 1 <= looks <= 20
    assert backend.told - told_before == looks  # one read per tick, not one per stream
    await backend.acquire("kernel-1", backend.check("4G"))
    while not all(own[-1] != first for own in seen) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*streams)
    assert all(own == [first, seen[0][-1]] for own in seen), "each stream sees the move once"


async def test_no_stream_is_woken_by_the_accounting_fold_but_every_one_by_a_start_and_an_end(
    tmp_path: Path,
) -> None:
    """The fold of a start's or an end's accounting events (the broker's housekeeping, a second
    or so later) commits figures no pool shows: no stream sends the unchanged pool again."""
    backend = Counted(GPUShare(simulate="1xA100-80GB", ledger_path=str(tmp_path / "ledger.sqlite")))
    backend.waited_in, backend.told = [], 0
    ticks = MarkerTicks(lambda: broker_marker(backend), 0.05)
    stop = asyncio.Event()
    seen: list[list[str]] = [[] for _ in range(30)]
    streams = [asyncio.ensure_future(follow(ticks, own, stop)) for own in seen]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60

    async def settled(count: int) -> None:
        """Until every stream has seen ``count`` markers, and the ticks looked again since."""
        while not all(len(own) >= count for own in seen) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert all(len(own) >= count for own in seen), "a stream missed a move"
        await looked_again(3)

    async def looked_again(looks: int) -> None:
        """Until the ticks have looked at the marker ``looks`` more times (each after now)."""
        wanted = ticks.looks + looks
        while ticks.looks < wanted and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert ticks.looks >= wanted

    await settled(1)
    await backend.acquire("kernel-1", backend.check("4G"))
    await settled(2)
    assert await asyncio.to_thread(backend.accounts.fold) == 1  # the start's event
    await looked_again(3)
    assert all(len(own) == 2 for own in seen), "a stream was woken by the fold"
    assert backend.free("kernel-1") is not None
    await settled(3)
    assert await asyncio.to_thread(backend.accounts.fold) == 1  # the end's event
    await looked_again(3)
    stop.set()
    await asyncio.gather(*streams)
    assert all(own == seen[0] and len(set(own)) == 3 for own in seen), "the start and the end, once each"
    assert backend.told == ticks.looks, "one read of the marker per tick for all the streams"


async def test_the_ticks_stop_when_no_stream_follows_and_start_afresh(tmp_path: Path) -> None:
    looked: list[str] = []

    async def look() -> str:
        looked.append("x")
        return "marker-1"

    ticks = MarkerTicks(look, 0.01)
    with ticks.following():
        assert await ticks.after(None, 5.0) == "marker-1"
        assert await ticks.after("marker-1", 0.05) is None  # no move: None at the timeout
    await asyncio.sleep(0.1)  # the ticker sees nobody follows and ends
    stopped_at = len(looked)
    await asyncio.sleep(0.1)
    assert len(looked) == stopped_at
    with ticks.following():
        assert await ticks.after(None, 5.0) == "marker-1"
    assert len(looked) > stopped_at


async def test_a_marker_that_cannot_be_read_is_tried_again_on_the_next_tick() -> None:
    answers: list[str | Exception] = [BackendUnavailableError("the ledger is busy"), "marker-2"]

    async def look() -> str:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    ticks = MarkerTicks(look, 0.01)
    with ticks.following():
        assert await ticks.after(None, 5.0) == "marker-2"
    assert ticks.looks >= 2
