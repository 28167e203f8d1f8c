"""One snapshot per change, shared by ``GET pool``, ``GET kernels`` and the stream (issue 24).

A real local backend on a real ledger; the server's kernel manager is the only stand-in (this
server started no kernel, so the views list the ledger's slices of its ``server_id``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.allocator import Policy
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.errors import BackendUnavailableError
from jupyter_gpushare.records import NewRequest, Placed
from jupyter_gpushare.server.context import GPUShareContext
from jupyter_gpushare.server.snapshots import Body, SharedReads, Snapshot
from jupyter_gpushare.server.starts import Start
from tests.polling import async_wait_until


class NoKernels:
    """A kernel manager that started nothing."""

    def list_kernel_ids(self) -> list[str]:
        return []

    def get_kernel(self, kernel_id: str) -> Any:
        raise KeyError(kernel_id)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(
        GPUShare(simulate="2xA100-80GB", ledger_path=str(tmp_path / "ledger.sqlite"), owner="alice")
    )
    for index in range(4):
        request = NewRequest(
            f"k-{index}", "alice", backend.server_id, "timeslice", "shared", "4G", None, backend.holder
        )
        assert isinstance(backend.ledger.request(request, Policy()), Placed)
        backend.ledger.report_usage(f"k-{index}", 2**30, 10, "simulated")
    yield backend
    backend.ledger.close()


def views_of(snapshot: Snapshot) -> dict[str, Any]:
    assert isinstance(snapshot.kernels, Body)
    return {view["kernel_id"]: view for view in json.loads(snapshot.kernels.text)}


def context_of(backend: LocalBackend) -> GPUShareContext:
    return GPUShareContext(backend=backend, kernel_manager=NoKernels(), kernel_spec_manager=None)


async def test_concurrent_requests_after_a_change_share_one_build(backend: LocalBackend) -> None:
    context = context_of(backend)
    first = await context.snapshots.current()
    assert await context.snapshots.current() is first, "no change: no new build"
    builds = context.snapshots.builds

    backend.ledger.report_usage("k-2", 3 * 2**30, 40, "simulated")
    answers = await asyncio.gather(*(context.snapshots.current() for _ in range(12)))
    assert context.snapshots.builds == builds + 1
    assert all(answer is answers[0] for answer in answers)
    assert answers[0] is not first
    assert views_of(answers[0])["k-2"]["memory_used"] == 3 * 2**30


async def test_the_stream_and_the_gets_answer_from_the_same_snapshot(backend: LocalBackend) -> None:
    context = context_of(backend)
    event = await context.stream_event()  # a sampling round first: fresh device figures
    builds = context.snapshots.builds
    snapshot = await context.snapshots.current()
    assert context.snapshots.builds == builds, "the GETs reuse what the stream's tick built"
    assert isinstance(snapshot.pool, Body) and isinstance(snapshot.kernels, Body)
    assert json.loads(event) == {"pool": backend.pool(), "kernels": context.server_kernels()}
    assert event == json.dumps({"pool": json.loads(snapshot.pool.text), "kernels": context.server_kernels()})
    assert snapshot.pool.data == snapshot.pool.text.encode()
    assert snapshot.kernels.etag == f'"{hashlib.sha1(snapshot.kernels.data).hexdigest()}"'


async def test_a_start_in_flight_and_what_it_does_renew_the_snapshot(backend: LocalBackend) -> None:
    context = context_of(backend)
    first = await context.snapshots.current()
    gate = asyncio.Event()
    task = asyncio.ensure_future(gate.wait())
    context.starts.track(Start("k-9", "python3-gpu-4g", "a.ipynb", task))  # type: ignore[arg-type]
    started = await context.snapshots.current()
    assert started is not first
    assert views_of(started)["k-9"]["state"] == "queued"
    context.starts.note("k-9", "waiting for its slice: position 2")
    noted = await context.snapshots.current()
    assert noted is not started
    assert views_of(noted)["k-9"]["detail"] == "waiting for its slice: position 2"
    assert await context.snapshots.current() is noted
    gate.set()
    await task


def test_an_unreadable_pool_shows_in_the_event_and_the_kernels_route_raises() -> None:
    problem = BackendUnavailableError("the ledger is gone")
    snapshot = Snapshot(object(), Body.of({"devices": [], "problem": "gone"}), problem)
    assert json.loads(snapshot.event()) == {"pool": {"devices": [], "problem": "gone"}, "kernels": []}
    assert not snapshot.complete
    broken = Snapshot(object(), ValueError("a bug"), Body.of([]))
    with pytest.raises(ValueError, match="a bug"):
        broken.event()


async def test_requests_arriving_together_share_one_read_and_later_ones_get_a_new_one() -> None:
    """Twenty requests cost one read of the backend's marker, yet none is answered with a read
    that began before it arrived (a client must see its own change)."""
    reads: list[int] = []
    gate = threading.Event()

    def read() -> int:
        reads.append(len(reads) + 1)
        assert gate.wait(30)
        return reads[-1]

    shared = SharedReads(read)
    together = [asyncio.ensure_future(shared.value()) for _ in range(20)]
    await async_wait_until(lambda: len(reads) == 1, message="the first read to start")
    late = asyncio.ensure_future(shared.value())  # arrives while the first read runs
    gate.set()
    assert await asyncio.gather(*together) == [1] * 20
    assert await late == 2
    assert reads == [1, 2]


async def test_a_failed_read_reaches_every_waiter_and_the_next_request_reads_again() -> None:
    answers = iter([RuntimeError("the broker is away"), "marker-2"])

    def read() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    shared = SharedReads(read)
    failed = await asyncio.gather(*(shared.value() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(error, RuntimeError) for error in failed)
    assert await shared.value() == "marker-2"
