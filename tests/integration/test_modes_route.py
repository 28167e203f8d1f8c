"""``GET api/gpushare/modes``: every installed mode, what enforces it, whether it resizes in
place, and whether this pool can honour it now or why not — on a simulated node, with a mode
another package adds, and on a Kubernetes cluster; each answer checked against the document."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ..cluster import KubeCluster
from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, start_server
from .kubernetes_server.support import server_for
from .test_openapi import Contract, load_document
from .test_toy_mode import install_toy_mode

pytestmark = pytest.mark.integration

CONTRACT = Contract(load_document())
OWN = ["exclusive", "mig", "mps", "timeslice", "vgpu"]


def modes(server: JupyterServer) -> dict[str, dict[str, Any]]:
    reply = server.request("GET", "/api/gpushare/modes")
    described = CONTRACT.check(reply, "/modes", "GET", 200)
    return {entry["name"]: entry for entry in described}


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


def test_a_simulated_node_honours_every_mode_but_mig_and_says_why_not(server: JupyterServer) -> None:
    described = modes(server)
    assert list(described) == OWN
    assert described["timeslice"] == {
        "name": "timeslice",
        "enforcement": "soft: framework caps and watchdog",
        "live_resize": True,
        "available": True,
        "reason": None,
    }
    assert described["exclusive"]["enforcement"] == "whole card"
    assert not described["exclusive"]["live_resize"]
    # The simulated A100 has no MIG instances: the sentence a start in mode mig is refused with.
    mig = described["mig"]
    assert not mig["available"]
    assert mig["reason"].startswith("mode 'mig' needs MIG instances: enable MIG")
    assert [name for name, entry in described.items() if entry["available"]] == (
        server.request("GET", "/api/gpushare/config").body["modes"]
    )


def test_a_mode_another_package_adds_is_described(node: Node) -> None:
    path = install_toy_mode(node.root / "site-packages")
    server = start_server(node, "toy-modes", {"PYTHONPATH": path})
    try:
        described = modes(server)
    finally:
        server.stop()
    assert list(described) == ["exclusive", "mig", "mps", "timeslice", "toy", "vgpu"]
    assert described["toy"] == {
        "name": "toy",
        "enforcement": "soft: the toy's own limit variable",
        "live_resize": False,
        "available": True,
        "reason": None,
    }


def test_a_cluster_of_hami_nodes_honours_vgpu_only(node: Node, kube: KubeCluster) -> None:
    server = server_for(node, kube)
    try:
        described = wait_until(
            lambda: modes(server), 60, 0.2, "the nodes watched", until=lambda d: d["vgpu"]["available"]
        )
    finally:
        server.stop()
    assert [name for name, entry in described.items() if entry["available"]] == ["vgpu"]
    assert described["mps"]["reason"] == "no GPU node of the cluster offers mode 'mps'"
    assert not described["vgpu"]["live_resize"] and described["vgpu"]["reason"] is None


def test_the_route_refuses_a_request_without_credentials(server: JupyterServer) -> None:
    request = urllib.request.Request(f"{server.url}/api/gpushare/modes")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code in (401, 403)
