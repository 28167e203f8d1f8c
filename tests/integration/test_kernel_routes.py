"""A local kernel may use the routes kernel pods call about themselves, with its own token.

The routes are the same for every backend (the provisioner checks the token); a kernel pod uses
them for everything, a local kernel can report declared use and read its own view. Another
kernel's token, or none, is refused; another server's kernel is unknown here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jupyter_gpushare.core.sizes import GiB

from ..support.nodes import Node
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


def started(server: JupyterServer) -> str:
    reply = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g"})
    assert reply.status == 201, reply
    return str(reply.body["kernel_id"])


async def token_of(server: JupyterServer, kernel_id: str) -> str:
    out, err = await execute(server, kernel_id, "import os; print(os.environ['JUPYTER_GPUSHARE_TOKEN'])")
    assert not err, err
    return out.strip()


async def test_a_local_kernel_reports_and_reads_itself_with_its_own_token(server: JupyterServer) -> None:
    mine, other = started(server), started(server)
    try:
        token, others_token = await token_of(server, mine), await token_of(server, other)
        assert token and others_token and token != others_token
        usage = f"{API}/kernels/{mine}/usage"
        report = {"memory_used": 3 * GiB, "utilization": 40, "source": "simulated"}

        refused = [
            server.request("POST", usage, report, token=None, headers={"X-GPUShare-Token": others_token}),
            server.request("POST", usage, report, token=None),
            server.request(
                "POST",
                f"{API}/kernels/not-a-kernel/usage",
                report,
                token=None,
                headers={"X-GPUShare-Token": token},
            ),
        ]
        assert [reply.status for reply in refused] == [403, 403, 404]
        assert server.request("GET", f"{API}/kernels/{mine}").body["memory_used"] == 0

        accepted = server.request("POST", usage, report, token=None, headers={"X-GPUShare-Token": token})
        assert accepted.status == 204, accepted
        view = server.request("GET", f"{API}/kernels/{mine}").body
        assert (view["memory_used"], view["utilization"], view["usage_source"]) == (3 * GiB, 40, "simulated")

        own = server.request(
            "GET", f"{API}/kernels/{mine}/self", token=None, headers={"X-GPUShare-Token": token}
        )
        assert own.status == 200 and own.body["kernel"]["kernel_id"] == mine
        assert own.body["pool"]["devices"][0]["memory_reserved"] == 8 * GiB
    finally:
        for kernel_id in (mine, other):
            server.request("DELETE", f"/api/kernels/{kernel_id}")
