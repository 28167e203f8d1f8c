"""Every route of the shipped OpenAPI document fuzzed against a real server: never a 5xx (SPEC §7).

Schemathesis generates requests from the document — valid ones and ones that break it on
purpose — and ``not_a_server_error`` fails on any 5xx. Bounded and deterministic: a fixed
number of examples per operation, derandomized, no example database. ``GET stream`` never ends,
so it is left out; ``POST kernels`` starts real kernels, so it gets few examples and every kernel
it starts is shut down at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

import jupyter_gpushare

from .conftest import Node
from .servers import JupyterServer, start_server

pytestmark = pytest.mark.integration

OPENAPI = Path(jupyter_gpushare.__file__).parent / "openapi.yaml"
API = "/api/gpushare"
MAX_EXAMPLES = 25
STARTS_KERNELS = 6  # examples for POST kernels: the valid ones start real kernels

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        "phases": {"stateful": {"enabled": False}},
        "suppress-health-check": ["all"],
        "operations": [
            {
                "include-path": "/kernels",
                "include-method": "POST",
                "generation": {"max-examples": STARTS_KERNELS},
            }
        ],
    }
)
SCHEMA = schemathesis.openapi.from_path(OPENAPI, config=CONFIG).exclude(path="/stream")


def auth(server: JupyterServer) -> dict[str, str]:
    return {"Authorization": f"token {server.token}"}


def server_tracebacks(server: JupyterServer) -> str:
    """The server log's tracebacks and 5xx lines, for the report of a failing example."""
    log = server.log()
    blocks = re.findall(r"(?ms)^.*?Traceback \(most recent call last\):.*?^\S.*?$", log)
    errors = [line for line in log.splitlines() if re.search(r"\b5\d\d (GET|POST|PATCH|DELETE|PUT)\b", line)]
    return "\n".join([*errors, *blocks])


@pytest.fixture
def fuzz_server(node: Node) -> Iterator[JupyterServer]:
    """A fresh server per operation; stopping it shuts down any kernel a POST started."""
    server = start_server(node, "fuzz")
    yield server
    server.stop()
    found = server_tracebacks(server)
    if found:
        print(f"---- server log: tracebacks and 5xx ----\n{found}")


def shut_down_started_kernel(server: JupyterServer, case: schemathesis.Case, response: Any) -> None:
    """Keep the pool empty between examples: a started kernel is shut down at once."""
    if (case.method, case.path) != ("POST", "/kernels") or response.status_code not in (201, 202):
        return
    kernel_id = response.json()["kernel_id"]
    if response.status_code == 202:  # withdraw the queued request first
        server.request("DELETE", f"{API}/kernels/{kernel_id}/gpu")
    server.request("DELETE", f"/api/kernels/{kernel_id}")


@SCHEMA.parametrize()
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzz_server: JupyterServer) -> None:
    response = case.call(base_url=f"{fuzz_server.url}{API}", headers=auth(fuzz_server), timeout=120)
    try:
        case.validate_response(response, checks=[not_a_server_error], headers=auth(fuzz_server))
    finally:
        shut_down_started_kernel(fuzz_server, case, response)


# ---- the routes of one kernel, with ids of real kernels -------------------------------------------
# Random ids only ever reach the 404 of a kernel that does not exist; these reach the code behind.


def start_kernel(server: JupyterServer, name: str) -> str:
    reply = server.request("POST", f"{API}/kernels", {"name": name})
    assert reply.status in (201, 202), reply
    return str(reply.body["kernel_id"])


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/kernels/{kernel_id}", "GET"),
        ("/kernels/{kernel_id}", "PATCH"),
        ("/kernels/{kernel_id}/gpu", "DELETE"),
    ],
)
def test_no_request_on_a_real_kernel_gets_a_server_error(
    path: str, method: str, fuzz_server: JupyterServer
) -> None:
    """A running 30G kernel, one queued behind two 30G, and one released: each fuzzed."""
    running = start_kernel(fuzz_server, "python3-gpu-30g")
    start_kernel(fuzz_server, "python3-gpu-30g")
    queued = start_kernel(fuzz_server, "python3-gpu-30g")
    released = start_kernel(fuzz_server, "python3-gpu-4g")
    assert fuzz_server.request("DELETE", f"{API}/kernels/{released}/gpu").status == 204
    operation = SCHEMA[path][method]

    for kernel_id in (running, queued, released):
        strategy = operation.as_strategy(
            generation_mode=GenerationMode.POSITIVE, path_parameters={"kernel_id": kernel_id}
        ) | operation.as_strategy(
            generation_mode=GenerationMode.NEGATIVE, path_parameters={"kernel_id": kernel_id}
        )

        @given(case=strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: schemathesis.Case) -> None:
            case.path_parameters["kernel_id"] = kernel_id  # negative mode may mangle it
            response = case.call(base_url=f"{fuzz_server.url}{API}", headers=auth(fuzz_server), timeout=120)
            case.validate_response(response, checks=[not_a_server_error], headers=auth(fuzz_server))

        fuzz()
