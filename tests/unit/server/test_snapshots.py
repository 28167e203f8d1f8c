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

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import BackendUnavailableError
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed
from jupyter_gpushare.server.context import GPUShareContext
from jupyter_gpushare.server.snapshots import Body, SharedReads, Snapshot
from jupyter_gpushare.server.starts import Start
from tests.support.polling import async_wait_until

ME = current_process()


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


async def test_a_marker_told_at_once_is_read_on_the_loop_once_for_the_requests_before_it() -> None:
    """No thread hop where the backend can tell its marker at once: the requests that arrived
    together share one read made after the last of them arrived, and a later request gets a
    read of its own; the worker thread's read is only for a marker that cannot be told so."""
    state = {"version": 1}
    at_once: list[int] = []
    waited: list[threading.Thread] = []

    def read_at_once() -> int | None:
        at_once.append(state["version"])
        return None if state["version"] == 3 else state["version"]

    def read() -> int:
        waited.append(threading.current_thread())
        return state["version"]

    shared = SharedReads(read, read_at_once)
    together = [asyncio.ensure_future(shared.value()) for _ in range(19)]
    state["version"] = 2  # a change made before the last request arrives: it must be seen
    together.append(asyncio.ensure_future(shared.value()))
    assert await asyncio.gather(*together) == [2] * 20
    assert at_once == [2] and waited == []
    state["version"] = 3  # a marker the backend cannot tell at once: read in a worker thread
    assert await shared.value() == 3
    assert at_once == [2, 3] and len(waited) == 1 and waited[0] is not threading.main_thread()


def test_a_slice_that_did_not_change_keeps_its_view_and_only_the_changed_one_is_made_again(
    backend: LocalBackend,
) -> None:
    context = context_of(backend)
    before = {view["kernel_id"]: view for view in context.server_kernels()}
    backend.ledger.report_usage("k-1", 5 * 2**30, 70, "simulated")
    after = {view["kernel_id"]: view for view in context.server_kernels()}
    assert all(after[kernel_id] is before[kernel_id] for kernel_id in ("k-0", "k-2", "k-3"))
    assert after["k-1"] is not before["k-1"]
    assert (after["k-1"]["memory_used"], before["k-1"]["memory_used"]) == (5 * 2**30, 2**30)
    backend.viewer = "bob"  # another viewer (a broker's caller): views of their own, none reused
    seen_by_bob = context.server_kernels()
    assert len(seen_by_bob) == 4 and not any(view is after.get(view["kernel_id"]) for view in seen_by_bob)


async def test_a_snapshot_renders_exactly_what_json_makes_of_the_views(backend: LocalBackend) -> None:
    context = context_of(backend)
    for size in (3, 5, 7):
        backend.ledger.report_usage("k-3", size * 2**30, size, "simulated")
        snapshot = await context.snapshots.current()
        assert isinstance(snapshot.kernels, Body)
        assert snapshot.kernels.text == json.dumps(context.server_kernels())
        assert views_of(snapshot)["k-3"]["memory_used"] == size * 2**30


async def test_this_servers_details_change_a_copy_not_the_kept_view(backend: LocalBackend) -> None:
    for kernel_id in ("k-8", "k-9"):  # a whole card each: the second waits in the queue
        request = NewRequest(kernel_id, "alice", backend.server_id, "timeslice", "shared", "80G", None, ME)
        backend.ledger.request(request, Policy())
    context = context_of(backend)
    plain = {view["kernel_id"]: view for view in context.server_kernels()}
    assert plain["k-9"]["state"] == "queued" and "detail" not in plain["k-9"]
    gate = asyncio.Event()
    task = asyncio.ensure_future(gate.wait())
    context.starts.track(Start("k-9", "python3-gpu-80g", "", task))  # type: ignore[arg-type]
    context.starts.note("k-9", "waiting for its slice: position 1")
    detailed = {view["kernel_id"]: view for view in context.server_kernels()}
    assert detailed["k-9"]["detail"] == "waiting for its slice: position 1"
    assert "detail" not in plain["k-9"], "the view handed out before did not change"
    gate.set()
    await task
