"""No kernel left behind (issue 25): a stopping server settles every waiting start first; a start
nobody asks after any more is withdrawn; a kernel no session refers to is shown as unused and
shut down after ``GPUShare.unused_kernel_timeout``.

Real ``jupyter server`` processes on one simulated 80G card; the negatives are read from the
ledger and the server's kernels, never after a fixed sleep.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading

import pytest

from jupyter_gpushare.core.sizes import GiB

from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
TIMEOUT = 5.0  # GPUShare.unused_kernel_timeout of these servers, seconds


def start(server: JupyterServer, memory: str) -> dict[str, object]:
    answer = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": memory})
    assert answer.status in (201, 202), answer.body
    return dict(answer.body)


def open_in_a_session(server: JupyterServer, kernel_id: object, path: str) -> None:
    """A notebook session that uses the kernel, as a browser tab does: the kernel is in use."""
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"id": kernel_id}}
    answer = server.request("POST", "/api/sessions", body)
    assert answer.status == 201, answer.body
    assert answer.body["kernel"]["id"] == kernel_id, answer.body


def kernel_views(server: JupyterServer) -> dict[str, dict[str, object]]:
    return {view["kernel_id"]: view for view in server.request("GET", f"{API}/kernels").body}


def kernel_ids(server: JupyterServer) -> set[str]:
    return {kernel["id"] for kernel in server.request("GET", "/api/kernels").body}


def test_sigterm_settles_a_running_and_a_queued_start_and_exits_at_once(node: Node) -> None:
    """Failed before: the queued start was placed after the shutdown, its kernel started and
    held its slice, and the server hung (shutdown_all failed with 404 for the pending kernel)."""
    server = start_server(node)
    try:
        running = start(server, "60G")
        assert running["state"] == "running"
        queued = start(server, "30G")
        assert queued["state"] == "queued"
        # A second waiting start through jupyter_server's own route, which blocks while it waits.
        plain = threading.Thread(
            target=lambda: server.request("POST", "/api/kernels", {"name": "python3-gpu-16g"}, timeout=90),
            daemon=True,
        )
        plain.start()
        wait_until(lambda: len(node.queued()), 30, message="two queued requests", until=lambda n: n == 2)

        server.process.send_signal(signal.SIGTERM)
        try:
            code = server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server was still running 60 s after one SIGTERM:\n{server.log()[-3000:]}")
        assert code == 0, server.log()[-3000:]
        assert node.ledger.records() == [], server.log()[-3000:]
        assert "Kernel started: " + str(queued["kernel_id"]) not in server.log()
    finally:
        server.stop()


def test_a_queued_start_nobody_asks_after_is_withdrawn(node: Node) -> None:
    node.write_server_config({"unused_kernel_timeout": TIMEOUT})
    server = start_server(node)
    try:
        blocker = start(server, "60G")
        # The blocker is open in a notebook, so it is not itself reclaimed as unused while the
        # forgotten start's timeout runs (on a busy machine this test outlasts that timeout).
        open_in_a_session(server, blocker["kernel_id"], "blocker.ipynb")
        left = start(server, "30G")  # its client went away (a closed tab)
        kept = start(server, "30G")  # its client keeps asking
        assert kept["state"] == left["state"] == "queued"

        def poll_kept() -> list[str]:
            view = server.request("GET", f"{API}/kernels/{kept['kernel_id']}").body
            return [record.kernel_id for record in node.queued()] if view["state"] == "queued" else []

        queued = wait_until(poll_kept, 60, 0.5, "the forgotten start withdrawn", until=lambda q: len(q) == 1)
        assert queued == [kept["kernel_id"]]
        assert "withdrew the queued start of kernel " + str(left["kernel_id"]) in server.log()
        answer = server.request("GET", f"{API}/kernels/{left['kernel_id']}")
        assert answer.status >= 400, answer.body

        # Room appears: the start still asked after runs; the withdrawn one never starts.
        assert server.request("DELETE", f"/api/kernels/{blocker['kernel_id']}").status == 204
        wait_until(
            lambda: server.request("GET", f"{API}/kernels/{kept['kernel_id']}").body["state"],
            60,
            message="the kept start running",
            until=lambda state: state == "running",
        )
        open_in_a_session(server, kept["kernel_id"], "kept.ipynb")
        assert kernel_ids(server) == {kept["kernel_id"]}
        assert [record.kernel_id for record in node.ledger.records()] == [kept["kernel_id"]]
    finally:
        server.stop()


def test_a_kernel_no_session_uses_is_shown_unused_then_shut_down(node: Node) -> None:
    node.write_server_config({"unused_kernel_timeout": TIMEOUT})
    server = start_server(node)
    try:
        orphan = start(server, "8G")
        used = start(server, "4G")
        session = server.request(
            "POST",
            "/api/sessions",
            {"path": "used.ipynb", "type": "notebook", "name": "", "kernel": {"id": used["kernel_id"]}},
        )
        assert session.status == 201, session.body

        views = wait_until(
            lambda: {view["kernel_id"]: view for view in server.request("GET", f"{API}/kernels").body},
            30,
            message="the orphan marked unused",
            until=lambda views: views.get(orphan["kernel_id"], {}).get("unused"),
        )
        assert "no notebook or console uses this kernel" in " ".join(views[orphan["kernel_id"]]["warnings"])
        assert "unused" not in views[used["kernel_id"]]

        wait_until(
            lambda: kernel_ids(server),
            60,
            message="the orphan shut down",
            until=lambda ids: ids == {used["kernel_id"]},
        )
        assert node.reserved() == 4 * GiB
        assert [record.kernel_id for record in node.running()] == [used["kernel_id"]]
        assert "no notebook or console used it for 5 s" in server.log()
    finally:
        server.stop()


def test_a_kernel_a_client_connects_to_is_no_longer_unused_at_once(node: Node) -> None:
    """The picker takes up a kernel marked unused as one left behind: a notebook that has just
    connected to its kernel must not see it so until the next look (every 2 s) reads the
    sessions, or changing that notebook's kernel would take the same kernel up again."""
    node.write_server_config({"unused_kernel_timeout": 600})
    server = start_server(node)
    try:
        kernel = start(server, "4G")
        kernel_id = str(kernel["kernel_id"])
        wait_until(
            lambda: kernel_views(server),
            30,
            message="the kernel marked unused",
            until=lambda views: views.get(kernel_id, {}).get("unused"),
        )

        async def connected_view() -> dict[str, object]:
            from tornado.httpclient import HTTPRequest
            from tornado.websocket import websocket_connect

            url = f"{server.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels"
            request = HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
            connection = await websocket_connect(request)
            try:
                return await asyncio.to_thread(lambda: kernel_views(server)[kernel_id])
            finally:
                connection.close()

        view = asyncio.run(connected_view())
        assert "unused" not in view, view
        assert not any("no notebook or console" in warning for warning in view["warnings"]), view
    finally:
        server.stop()
