"""Closed-loop HTTP load on loopback, for ``api_latency.py``: clients, timings, summaries.

N clients, one kept-alive connection each, all in one asyncio loop in this process, each make a
few warm-up requests and then, all released at once, M requests back to back to one route; each
request is timed from send to the last body byte and must answer 200 (a gzip-compressed body is
decompressed in the warm-up only: in the timed requests that client work, which the baseline's
small body does not need, would delay the other clients sharing the loop). The server process's CPU
time (user + system, psutil) is taken over the measured phase only. By default the clients are a
minimal HTTP/1.1 client on asyncio streams, which spends a fraction of httpx's CPU per request,
so that on a small machine the clients do not queue behind themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx

WARMUP = 5  # requests per client before the measured phase


class Target(Protocol):
    """The server under load: where it listens, how to authenticate, its CPU time so far."""

    @property
    def url(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...

    def cpu_seconds(self) -> float: ...


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)  # seconds
    wall: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0


class RawClient:
    """A minimal HTTP/1.1 keep-alive GET client on asyncio streams.

    It spends a fraction of httpx's CPU per request, so on a small machine the clients queue
    less behind themselves and the latency measured is more the server's.
    """

    accept_gzip = True  # as a browser does: the large lists then come compressed

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parsed = httpx.URL(url)
        self._host = parsed.host
        self._port = parsed.port or 80
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        coding = "Accept-Encoding: gzip\r\n" if self.accept_gzip else ""
        self._head = (
            f"Host: {self._host}:{self._port}\r\n{lines}Accept: application/json\r\n{coding}\r\n".encode()
        )
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, decode: bool = True) -> tuple[int, bytes]:
        """The status and the body (``decode``: gzip-decompressed; else as it came)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        self._writer.write(f"GET {path} HTTP/1.1\r\n".encode() + self._head)
        await self._writer.drain()
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = {}
        for line in head[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                fields[name.strip().lower()] = value.strip().lower()
        if "content-length" in fields:
            body = await self._reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self._reader.readexactly(size + 2))
                if size == 0:
                    break
            body = b"".join(part[:-2] for part in parts)
        else:
            raise RuntimeError(f"GET {path}: a response with neither Content-Length nor chunks")
        if decode and fields.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if fields.get("connection") == "close":
            await self.close()
        return status, body

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


class IdentityClient(RawClient):
    """The same, asking for no compression: what the large lists cost as plain bytes."""

    accept_gzip = False


class HttpxClient:
    def __init__(self, url: str, headers: dict[str, str]) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._url = url
        self._client = httpx.AsyncClient(headers=headers, timeout=60.0, limits=limits)

    async def get(self, path: str, decode: bool = True) -> tuple[int, bytes]:
        # httpx always decodes: its figures include the decompression (see load).
        reply = await self._client.get(f"{self._url}{path}")
        return reply.status_code, reply.content

    async def close(self) -> None:
        await self._client.aclose()


CLIENTS: dict[str, type[RawClient] | type[HttpxClient]] = {
    "raw": RawClient,
    "raw-identity": IdentityClient,
    "httpx": HttpxClient,
}


async def load(server: Target, path: str, clients: int, per_client: int, kind: str) -> Phase:
    """``clients`` closed-loop clients, ``per_client`` timed requests each, released together."""
    phase = Phase()
    ready = 0
    all_ready = asyncio.Event()
    go = asyncio.Event()

    async def client_loop() -> list[float]:
        nonlocal ready
        timings: list[float] = []
        client = CLIENTS[kind](server.url, server.headers)
        try:
            for _ in range(WARMUP):
                status, body = await client.get(path)
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}: {body[:200]!r}")
            ready += 1
            if ready == clients:
                all_ready.set()
            await go.wait()
            for _ in range(per_client):
                started = time.perf_counter()
                # Not decompressed: the 20 clients share one event loop, where decompressing a
                # burst of answers (60 µs each for 55 KiB) would delay the others' clocks on the
                # compressed routes only. The warm-up requests decompress theirs.
                status, body = await client.get(path, decode=False)
                timings.append(time.perf_counter() - started)
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}: {body[:200]!r}")
        finally:
            await client.close()
        return timings

    tasks = [asyncio.ensure_future(client_loop()) for _ in range(clients)]
    try:
        waiter = asyncio.ensure_future(all_ready.wait())
        await asyncio.wait([waiter, *tasks], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if not all_ready.is_set():
            waiter.cancel()
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            raise RuntimeError("clients did not finish warming up in 120 s")
        cpu_before = server.cpu_seconds()
        client_before = time.process_time()
        started = time.perf_counter()
        go.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
        phase.wall = time.perf_counter() - started
        phase.server_cpu = server.cpu_seconds() - cpu_before
        phase.client_cpu = time.process_time() - client_before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for timings in results:
        phase.latencies.extend(timings)
    return phase


def merge(phases: list[Phase]) -> Phase:
    merged = Phase()
    for phase in phases:
        merged.latencies.extend(phase.latencies)
        merged.wall += phase.wall
        merged.server_cpu += phase.server_cpu
        merged.client_cpu += phase.client_cpu
    return merged


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Summary:
    label: str
    count: int
    p50: float  # ms
    p90: float
    p99: float
    max: float
    rate: float  # requests/s
    server_ms: float  # server CPU ms per request
    server_share: float  # server CPU, share of one core
    client_share: float


def summarise(label: str, phase: Phase) -> Summary:
    values = phase.latencies
    count = len(values)
    return Summary(
        label,
        count,
        1000 * percentile(values, 0.50),
        1000 * percentile(values, 0.90),
        1000 * percentile(values, 0.99),
        1000 * max(values),
        count / phase.wall,
        1000 * phase.server_cpu / count,
        phase.server_cpu / phase.wall,
        phase.client_cpu / phase.wall,
    )


def print_latency_table(title: str, rows: list[Summary]) -> None:
    print(title)
    header = (
        f"  {'route':<28}{'requests':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'req/s':>8}{'srv CPU ms/req':>16}{'srv CPU':>9}{'client CPU':>11}"
    )
    print(header)
    for row in rows:
        print(
            f"  {row.label:<28}{row.count:>9}{row.p50:>9.2f}{row.p90:>9.2f}{row.p99:>9.2f}{row.max:>9.2f}"
            f"{row.rate:>8.0f}{row.server_ms:>16.2f}{100 * row.server_share:>8.0f}%"
            f"{100 * row.client_share:>10.0f}%"
        )
