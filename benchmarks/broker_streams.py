"""The GPU broker's event streams: what the servers that follow it cost it, and how soon a change
reaches them all.

Method
------
One ``jupyter gpushare broker --socket …`` process over a simulated ``1xA100-80GB`` pool, with
``sample_interval`` 0.1 s, so that the broker looks at the pool's change marker ten times a
second for its streams (the fastest tick a broker allows). Every server on a team box holds one
such stream.

1. **Idle broker.** The broker's CPU (user + system, from ``/proc``) over ``--seconds`` with no
   stream open: the baseline, in the same run.
2. **Idle streams.** ``--streams`` streams open (each has had its first event; nothing changes
   in the pool): the broker's CPU over ``--seconds``, and what one stream costs per tick, i.e.
   (CPU with the streams - idle CPU) / (streams x ticks per second).
3. **A change to every stream.** ``--changes`` times a slice is asked for over the socket and
   freed again (two changes each); for each change, the time from the call's answer to the
   moment the last of the streams has an event after the call began. The streams then settle
   on the broker's ``GET marker`` before the next change. The broker's housekeeping (every
   2 s) commits too after a start or an end (the accounting folds its events); that commit
   moves no marker (the ledger's views' version), so no stream has an event for it: after the
   changes and one more housekeeping round, the events each stream had per change (goal 1).

Goals: one stream costs the broker at most 20 µs of CPU per tick (the broker looks at the marker
once a tick for all its streams: before, each stream looked on its own, 76–117 µs); a change
reaches the last of the streams within 0.3 s (median; three ticks).

Run: ``.venv/bin/python benchmarks/broker_streams.py`` (50 streams, 10 s each phase, 10 changes;
about half a minute); ``--quick``: 40 streams, 6 s, 3 changes (about the shortest run whose CPU
figure, counted in clock ticks by /proc, can tell the per-stream goal; a figure within its error
of the goal is reported as such, not judged). ``--against REV [--repeat N]``
runs it alternately on this checkout and on the package of git revision REV (see
``against.py``) and prints the ratios. A user may hold 64 connections to the broker's socket
(``GPUShareBroker.max_connections_per_user``): at most 60 streams.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any

from against import Figure, add_options, run_against, write_figures
from broker_start import isolate, start_broker

TICK_S = 0.1  # the broker's fastest stream tick (sample_interval 0.1 s)
GOAL_CPU_PER_STREAM_TICK_US = 20.0
GOAL_CHANGE_TO_ALL_S = 0.3
MAX_STREAMS = 60  # under the per-user connection share of 64, leaving room for the calls
EVENT_WAIT_S = 30.0  # how long a stream's event may take before the run fails
HOUSEKEEPING_S = 2.0  # the broker's housekeeping round (jupyter_gpushare.broker.app)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one core process ``pid`` used over the next ``seconds``."""
    began, cpu = time.monotonic(), cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / (time.monotonic() - began)


class Stream:
    """One ``GET stream`` of the broker, read in a thread: each event's marker and arrival."""

    def __init__(self, connection: HTTPConnection, path: str) -> None:
        connection.request("GET", path)
        self._response: HTTPResponse = connection.getresponse()
        if self._response.status != 200:
            raise RuntimeError(f"GET stream answered {self._response.status}: {self._response.read()!r}")
        self._connection = connection
        self._closed = False
        self.failure: Exception | None = None  # why the stream ended before the run closed it
        self.events: list[tuple[float, str]] = []  # (monotonic arrival, marker)
        self._arrived = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response:
                if line.startswith(b"data: "):
                    marker = str(json.loads(line[6:])["marker"])
                    with self._arrived:
                        self.events.append((time.monotonic(), marker))
                        self._arrived.notify_all()
        except Exception as error:  # a closed connection fails in many ways
            if not self._closed:
                with self._arrived:
                    self.failure = error
                    self._arrived.notify_all()

    def first_after(self, moment: float) -> tuple[float, str]:
        """The first event that arrived after ``moment`` (monotonic), once there is one."""

        def arrived() -> tuple[float, str] | None:
            return next((event for event in self.events if event[0] > moment), None)

        with self._arrived:
            self._arrived.wait_for(lambda: arrived() is not None or self.failure, EVENT_WAIT_S)
            event = arrived()
            if event is None:
                raise RuntimeError(f"a stream had no event within {EVENT_WAIT_S:g} s ({self.failure!r})")
            return event

    @property
    def latest(self) -> str | None:
        with self._arrived:
            return self.events[-1][1] if self.events else None

    def close(self) -> None:
        """End the stream at once: the reading thread holds the response's buffer, and closing
        that would wait for its read (the next keep-alive), so the socket is shut down first."""
        self._closed = True
        if self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(EVENT_WAIT_S)
        self._connection.close()


def settled(streams: list[Stream], client: Any) -> None:
    """Once every stream's latest event carries the broker's marker as ``GET marker`` tells it."""
    deadline = time.monotonic() + EVENT_WAIT_S
    while True:
        marker = client.call("GET", "marker")["marker"]
        if all(stream.latest == marker for stream in streams):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the streams did not settle on marker {marker} within {EVENT_WAIT_S:g} s")
        time.sleep(TICK_S)


def measure(streams: int, seconds: float, changes: int, root: Path) -> list[Figure]:
    from jupyter_gpushare.backends.broker_client.transport import BrokerAddress, BrokerClient

    os.environ["JUPYTER_GPUSHARE_SAMPLE_INTERVAL"] = str(TICK_S)
    broker, url = start_broker(root)
    address, client = BrokerAddress(url), BrokerClient(url)
    opened: list[Stream] = []
    try:
        time.sleep(1.0)  # the broker's start-up work done
        idle = cpu_share(broker.pid, seconds)
        for _ in range(streams):
            opened.append(Stream(address.connection(60), address.path("stream")))
        settled(opened, client)
        before = sum(len(stream.events) for stream in opened)
        with_streams = cpu_share(broker.pid, seconds)
        # Nothing is changed meanwhile; a late commit of the broker's own (its housekeeping on a
        # busy machine) would be sent to every stream, and its cost is then in the figure.
        unasked = sum(len(stream.events) for stream in opened) - before
        stream_ticks_per_second = streams / TICK_S
        per_stream_tick_us = max(with_streams - idle, 0.0) / stream_ticks_per_second * 1e6
        # /proc counts CPU in clock ticks: each phase's figure is within one tick either way,
        # so the difference of two phases is known to within two ticks over the phase.
        error_us = 2 / os.sysconf("SC_CLK_TCK") / seconds / stream_ticks_per_second * 1e6

        latencies: list[float] = []
        sent_before = sum(len(stream.events) for stream in opened)
        for _ in range(changes):
            kernel_id = str(uuid.uuid4())
            for method, route, body in (
                ("POST", "slices", {"kernel_id": kernel_id, "gpu_memory": "1G"}),
                ("DELETE", f"slices/{kernel_id}", None),
            ):
                began = time.monotonic()
                client.call(method, route, body)
                answered = time.monotonic()
                last = max(stream.first_after(began)[0] for stream in opened)
                latencies.append(max(last - answered, 0.0))
                settled(opened, client)
        # The housekeeping folds the last change's accounting events within a round: wait one
        # out, then count what each stream was sent for the changes (one event each is all).
        time.sleep(HOUSEKEEPING_S + 1.0)
        sent = sum(len(stream.events) for stream in opened) - sent_before
        events_per_change = sent / (len(opened) * len(latencies))
    finally:
        for stream in opened:
            stream.close()
        broker.terminate()
        broker.wait(timeout=30)

    median = statistics.median(latencies)
    print(f"simulated 1xA100-80GB, stream tick {TICK_S} s, {seconds:g} s per CPU phase")
    print(f"{'':<36}{'broker CPU, % of a core':>24}")
    print(f"{'idle broker (baseline)':<36}{100 * idle:>24.2f}")
    print(f"{f'{streams} idle streams':<36}{100 * with_streams:>24.2f}")
    if unasked:
        print(f"(the broker committed during that phase: {unasked} events sent, their cost included)")
    print(
        f"one stream, one tick: {per_stream_tick_us:.1f} ± {error_us:.1f} µs of broker CPU "
        f"({stream_ticks_per_second:.0f}/s)"
    )
    print(
        f"a change to all {streams} streams ({len(latencies)} changes): median {1000 * median:.0f} ms, "
        f"max {1000 * max(latencies):.0f} ms"
    )
    print(
        f"events per stream per change: {events_per_change:.2f} "
        "(1: the accounting's fold after a start or an end sends nothing)"
    )
    # Judged only where the measurement can tell: a run too short for the goal says so.
    if per_stream_tick_us + error_us <= GOAL_CPU_PER_STREAM_TICK_US:
        cpu_verdict = "met"
    elif per_stream_tick_us - error_us > GOAL_CPU_PER_STREAM_TICK_US:
        cpu_verdict = "MISSED"
    else:
        cpu_verdict = f"cannot tell at ± {error_us:.0f} µs (a longer --seconds can)"
    latency_met = median <= GOAL_CHANGE_TO_ALL_S
    print(
        f"VERDICT one stream's tick <= {GOAL_CPU_PER_STREAM_TICK_US:.0f} µs: {cpu_verdict}; "
        f"a change to all streams <= {1000 * GOAL_CHANGE_TO_ALL_S:.0f} ms (median): "
        f"{'met' if latency_met else 'MISSED'}"
    )
    return [
        Figure("broker CPU % of a core, idle", 100 * idle),
        Figure(f"broker CPU % of a core, {streams} idle streams", 100 * with_streams),
        Figure("broker CPU µs per stream per tick", per_stream_tick_us),
        Figure("change to all streams, median ms", 1000 * median),
        Figure("events per stream per change", events_per_change),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=50, help=f"streams open at once (1-{MAX_STREAMS})")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each CPU phase")
    parser.add_argument("--changes", type=int, default=10, help="slices asked for and freed")
    parser.add_argument("--quick", action="store_true", help="40 streams, 6 s phases, 3 changes")
    add_options(parser)
    arguments = parser.parse_args(argv)
    if arguments.against:
        return run_against(
            __file__, sys.argv[1:] if argv is None else argv, arguments.against, arguments.repeat
        )
    streams, seconds, changes = (
        (40, 6.0, 3) if arguments.quick else (arguments.streams, arguments.seconds, arguments.changes)
    )
    if not 1 <= streams <= MAX_STREAMS or seconds <= 0 or changes < 1:
        parser.error(f"--streams must be 1-{MAX_STREAMS}, --seconds above 0 and --changes at least 1")
    with tempfile.TemporaryDirectory(prefix="gpushare-broker-streams-") as directory:
        root = Path(directory)
        isolate(root)
        write_figures(arguments.figures, measure(streams, seconds, changes, root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
