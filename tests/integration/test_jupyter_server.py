"""Kernels with GPU slices started through a real ``jupyter server`` process over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from jupyter_gpushare.core.sizes import GiB

from ..support.kernels import wait_for_exit
from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, Response, start_server

pytestmark = pytest.mark.integration


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


def test_two_30g_kernels_run_and_a_third_queues_until_one_ends(node: Node, server: JupyterServer) -> None:
    first = server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"})
    second = server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"})
    assert (first.status, second.status) == (201, 201)
    assert node.reserved() == 60 * GiB

    third: list[Response] = []
    waiter = threading.Thread(
        target=lambda: third.append(server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"}))
    )
    waiter.start()
    wait_until(lambda: len(node.queued()) == 1)
    queued = node.queued()[0]
    assert node.ledger.queue_position(queued.kernel_id) == 1
    # The server's own view says the same: queued at position 1, nothing placed for it.
    (listed,) = [k for k in server.request("GET", "/api/gpushare/kernels").body if k["state"] == "queued"]
    assert (listed["kernel_id"], listed["queue_position"], listed["device"]) == (queued.kernel_id, 1, None)
    assert not third and node.reserved() == 60 * GiB, "the third kernel started while the card was full"

    assert server.request("DELETE", f"/api/kernels/{first.body['id']}").status == 204
    waiter.join(timeout=60)
    assert third and third[0].status == 201, third
    assert third[0].body["id"] == queued.kernel_id

    listed = {kernel["id"] for kernel in server.request("GET", "/api/kernels").body}
    assert listed == {second.body["id"], queued.kernel_id}
    assert {record.kernel_id for record in node.running()} == listed

    for kernel_id in listed:
        assert server.request("DELETE", f"/api/kernels/{kernel_id}").status == 204
    assert node.ledger.records() == []


def test_when_full_fail_answers_at_once_with_the_free_memory(node: Node) -> None:
    node.write_server_config({"when_full": "fail"})
    server = start_server(node, "failing")
    try:
        assert server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"}).status == 201
        assert server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"}).status == 201
        started = time.monotonic()
        refused = server.request("POST", "/api/kernels", {"name": "python3-gpu-30g"})
        assert time.monotonic() - started < 5
        assert refused.status >= 400
        assert "30G does not fit: 20G free on GPU0" in str(refused.body)
        assert len(server.request("GET", "/api/kernels").body) == 2
        assert len(node.running()) == 2 and node.queued() == []
        kernel_pids = [record.process.pid for record in node.running()]
    finally:
        # jupyter_client keeps a kernel whose start failed in its pending starts, and a server's
        # shutdown used to wait ~30 s on it; the provisioner drops it, so the server stops at once.
        stopping = time.monotonic()
        server.stop(timeout=60)
        assert time.monotonic() - stopping < 15, "the server's shutdown waited on the failed start"
    # However the server ended, its kernels exit and no slice outlives them.
    for pid in kernel_pids:
        wait_for_exit(pid)
    node.ledger.reconcile()
    assert node.ledger.records() == []
