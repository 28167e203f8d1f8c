"""Whether a local kernel's traffic is encrypted (issue 37): where nobody else shares the node, the
server's own policy (``c.MappingKernelManager.transport_encryption``) decides; where other users
share it (here a ledger file the group may write), it is encrypted, and a server whose
configuration says "disabled" gets a refusal that names both settings, with nothing reserved."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

PLAIN = "Kernel is running over TCP without encryption"


def connection(node: Node, kernel_id: str) -> dict[str, object]:
    path = Path(node.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"
    return dict(json.loads(wait_until(lambda: path.is_file() and path.read_text(), 60, message=str(path))))


def share_the_ledger(node: Node) -> None:
    """The node's ledger as one shared without a broker: a file the group may write."""
    node.ledger.records()  # creates it
    os.chmod(node.ledger_path, 0o660)


def started_kernel(server: JupyterServer) -> str:
    started = server.request("POST", "/api/kernels", {"name": "python3-gpu-4g"})
    assert started.status == 201, started.body
    return str(started.body["id"])


@pytest.mark.parametrize("policy", [None, "auto"])
def test_where_nobody_else_shares_the_node_the_servers_policy_decides(node: Node, policy: str | None) -> None:
    """Failed before with no policy (jupyter_server's default, "disabled"): the connection file
    had CurveZMQ keys, as with "auto" (jupyter_server's own
    test_transport_encryption_disabled_no_curve_keys, run with our provisioner, failed too)."""
    if policy:
        node.write_server_config({}, MappingKernelManager={"transport_encryption": policy})
    server = start_server(node)
    try:
        kernel_id = started_kernel(server)
        keys = connection(node, kernel_id)
        encrypted = policy == "auto"
        assert bool(keys.get("curve_publickey")) is encrypted, keys
        out, _ = asyncio.run(execute(server, kernel_id, "print(6 * 7)"))
        assert out.strip() == "42"  # through the server's websocket, encrypted or not
        assert (PLAIN in server.log()) is not encrypted
    finally:
        server.stop()


def test_where_other_users_share_the_node_the_traffic_is_encrypted(node: Node) -> None:
    """No policy configured: the node's requirement wins over jupyter_server's default."""
    share_the_ledger(node)
    server = start_server(node)
    try:
        kernel_id = started_kernel(server)
        keys = connection(node, kernel_id)
        assert keys.get("curve_publickey") and keys.get("curve_secretkey"), keys
        out, _ = asyncio.run(execute(server, kernel_id, "print(6 * 7)"))
        assert out.strip() == "42"
        assert PLAIN not in server.log()
    finally:
        server.stop()


def test_where_other_users_share_the_node_a_disabled_policy_refuses_the_start(node: Node) -> None:
    """Failed before: the kernel started, encrypted against the server's explicit "disabled"."""
    share_the_ledger(node)
    node.write_server_config({}, MappingKernelManager={"transport_encryption": "disabled"})
    server = start_server(node)
    try:
        refused = server.request("POST", "/api/kernels", {"name": "python3-gpu-4g"})
        assert refused.status == 500, refused
        assert refused.body["message"] == (
            "c.GPUShare.encrypt requires encrypted kernel traffic where other users share the node "
            "(a GPU broker or a shared ledger), but c.MappingKernelManager.transport_encryption is "
            "'disabled': set it to 'auto' or 'required', or c.GPUShare.encrypt = False"
        ), refused.body
        assert node.ledger.records() == []  # nothing reserved
        assert server.request("GET", "/api/kernels").body == []
        assert not list(Path(node.env["JUPYTER_RUNTIME_DIR"]).glob("kernel-*.json"))
    finally:
        server.stop()
