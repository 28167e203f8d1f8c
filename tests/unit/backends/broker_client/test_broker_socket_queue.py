"""A burst of callers on the broker's Unix socket: where its listen queue is full, the client
waits its turn (until its timeout) instead of failing "not reachable" at once (EAGAIN)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError

BODY = b'{"ok": true}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
ANSWER = HEAD % len(BODY) + BODY
BUSY = 0.5  # seconds the stand-in broker accepts nothing


@pytest.fixture
def full_queue(tmp_path: Path) -> Iterator[tuple[socket.socket, str, list[socket.socket]]]:
    """A listening Unix socket (a stand-in for a broker too busy to accept) whose queue of one
    is filled by a connection nobody accepted yet."""
    path = str(tmp_path / "broker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    waiting: list[socket.socket] = []
    for _ in range(8):  # until the kernel's queue is full
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(path)
        except BlockingIOError:
            filler.close()
            break
        waiting.append(filler)
    else:
        pytest.fail("the listen queue never filled")
    yield server, path, waiting
    for connection in waiting:
        connection.close()
    server.close()


def test_a_call_waits_for_room_in_a_full_listen_queue(
    full_queue: tuple[socket.socket, str, list[socket.socket]],
) -> None:
    server, path, _ = full_queue
    answered: list[object] = []
    caller = threading.Thread(
        target=lambda: answered.append(BrokerClient(f"unix:{path}", timeout=30).call("GET", "info"))
    )
    caller.start()
    caller.join(BUSY)  # the broker is busy a while: the queue stays full (the scenario, not a wait)
    # The broker catches up: it accepts what was queued, then the caller's connection, and answers.
    served = 0
    while caller.is_alive() or served == 0:
        server.settimeout(30)
        connection, _ = server.accept()
        with connection:
            connection.settimeout(0.5)
            try:
                if connection.recv(65536):
                    connection.sendall(ANSWER)
                    served += 1
            except TimeoutError:
                pass  # one of the fillers: it never asks anything
        if served:
            break
    caller.join(30)
    assert answered == [{"ok": True}]


def test_a_queue_that_stays_full_fails_the_call_at_its_timeout_with_one_sentence(
    full_queue: tuple[socket.socket, str, list[socket.socket]],
) -> None:
    _, path, _ = full_queue
    with pytest.raises(UnreachableError, match=r"^the GPU broker at unix:.* is not reachable: "):
        BrokerClient(f"unix:{path}", timeout=0.5).call("GET", "info")
