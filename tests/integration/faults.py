"""What the API-server fault tests share: a control plane of the test module's own, and the faults.

test_cluster_faults.py (a Jupyter server on the Kubernetes backend) and test_broker_faults.py (the
broker) take their control plane down, freeze it and bring it back — the same directory, data,
certificates and port — so each runs its own (their ``control_plane`` fixture overrides the
session's) and other modules never see the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from ..cluster import ControlPlane

OUTAGE = 20.0  # seconds the API server stays away (stopped, or frozen)
# No watch cache, etcd compacting every second: a watch resumed from a version a few seconds old
# reads etcd, where that version is gone, and is answered 410 Gone.
COMPACTING = ("--apiserver-arg=--watch-cache=false", "--apiserver-arg=--etcd-compaction-interval=1s")


@contextlib.contextmanager
def own_control_plane(directory: Path, *, compacting: bool = False) -> Iterator[ControlPlane]:
    """A control plane for one test module (or one test), stopped at the end."""
    with ControlPlane(directory, extra_args=COMPACTING if compacting else ()) as plane:
        yield plane


@contextlib.contextmanager
def api_server_down(plane: ControlPlane) -> Iterator[float]:
    """The control plane stopped (as a crash or an upgrade stops it) until the block ends, then
    started again where it was; yields when it went."""
    plane.down()
    try:
        yield time.monotonic()
    finally:
        plane.start()


@contextlib.contextmanager
def api_server_frozen(plane: ControlPlane) -> Iterator[float]:
    """The control plane SIGSTOPped (its port accepts, nothing answers) until the block ends,
    then SIGCONTed; yields when it froze."""
    plane.freeze()
    try:
        yield time.monotonic()
    finally:
        plane.thaw()


async def runs_code_throughout(
    run: Callable[[], Awaitable[tuple[str, str]]], since: float, seconds: float = OUTAGE
) -> None:
    """A kernel answers ``print(6 * 7)`` (``run``) every second until ``seconds`` after ``since``:
    the fault's length is the scenario here, not a wait for state."""
    while time.monotonic() - since < seconds:
        assert await run() == ("42\n", "")
        await asyncio.sleep(1)
