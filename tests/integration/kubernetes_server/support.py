"""Starting a jupyter server on the test cluster and reading its API as the panel does,
each answer checked against the OpenAPI document; shared by the tests of this package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...cluster import KubeCluster
from ...support.nodes import IMAGE, Node
from ...support.polling import wait_until
from ...support.servers import JupyterServer, start_server
from ..test_openapi import Contract, load_document


def server_for(
    node: Node,
    cluster: KubeCluster,
    name: str = "k8s",
    provisioner: dict[str, Any] | None = None,
    **gpushare: str,
) -> JupyterServer:
    config = Path(node.env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    config.write_text(json.dumps({"KubernetesProvisioner": {"poll_interval": 0.1, **(provisioner or {})}}))
    environment = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "JUPYTER_GPUSHARE_BACKEND": "kubernetes",
        "JUPYTER_GPUSHARE_RESOURCE_PRESET": "hami",
        "JUPYTER_GPUSHARE_KERNEL_IMAGE": IMAGE,
        "JUPYTER_GPUSHARE_OWNER": "alice",
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.2",
        **{f"JUPYTER_GPUSHARE_{key.upper()}": value for key, value in gpushare.items()},
    }
    return start_server(node, name, environment)


# How often the tests poll the server's API (each poll is a request to a busy server).
POLL = 0.1


CONTRACT = Contract(load_document())


def get(server: JupyterServer, path: str) -> Any:
    """``GET api/gpushare/{path}``, checked against the OpenAPI document."""
    response = server.request("GET", f"/api/gpushare/{path}")
    assert response.status == 200, response.body
    route = "/kernels/{kernel_id}" if path.startswith("kernels/") else f"/{path}"
    return CONTRACT.check(response, route, "GET", 200)


def start(server: JupyterServer, body: dict[str, Any]) -> dict[str, Any]:
    started = server.request("POST", "/api/gpushare/kernels", body)
    assert started.status in (201, 202), started.body
    return dict(CONTRACT.check(started, "/kernels", "POST"))


def running_view(server: JupyterServer, kernel_id: str, timeout: float = 120) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: server.request("GET", f"/api/gpushare/kernels/{kernel_id}").body,
            timeout,
            POLL,
            f"kernel {kernel_id} running",
            until=lambda view: isinstance(view, dict) and view.get("state") == "running",
        )
    )


def listed_by_jupyter_server(server: JupyterServer, kernel_id: str, timeout: float = 120) -> None:
    """Wait until jupyter_server's own ``GET api/kernels/{id}`` knows the kernel: it lists a pod
    kernel once the kernel answered, as the panel waits for it."""
    wait_until(
        lambda: server.request("GET", f"/api/kernels/{kernel_id}").status,
        timeout,
        0.2,
        f"jupyter_server's kernel {kernel_id}",
        until=lambda status: status == 200,
    )
