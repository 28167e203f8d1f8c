"""``GET api/gpushare/config``: what the JupyterLab size picker offers (the presets of
``GPUShare.sizes``, the defaults, this node's modes), as documented in the OpenAPI document."""

from __future__ import annotations

import pytest

from ..support.nodes import Node
from ..support.servers import start_server
from .test_openapi import Contract, load_document

pytestmark = pytest.mark.integration


def test_config_answers_the_configured_presets_and_the_modes_of_the_node(node: Node) -> None:
    node.write_server_config({"sizes": ["1G", "6G", "25%", "whole"], "default_memory": "6G"})
    server = start_server(node)
    try:
        contract = Contract(load_document())
        reply = server.request("GET", "/api/gpushare/config")
        body = contract.check(reply, "/config", "GET", status=200)
        assert body["sizes"] == ["1G", "6G", "25%", "whole"]
        assert (body["default_memory"], body["default_mode"]) == ("6G", "timeslice")
        # A simulated pool accepts every mode but MIG, which needs MIG instances.
        assert body["modes"] == ["exclusive", "mps", "timeslice", "vgpu"]
        refused = server.request("GET", "/api/gpushare/config", token=None)
        contract.check(refused, "/config", "GET")
        assert refused.status in (401, 403)
    finally:
        server.stop()
