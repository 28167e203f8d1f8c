"""Every route of the shipped OpenAPI document fuzzed against a real server: never a 5xx
(docs/reference/rest-api.md).

Schemathesis generates requests from the document — valid ones and ones that break it on
purpose — and ``not_a_server_error`` fails on any 5xx; every answer must also have a documented
status and fit its documented schema. Bounded and deterministic: a fixed
number of examples per operation, derandomized, no example database. ``GET stream`` never ends,
so it is left out; ``POST kernels`` starts real kernels, so it gets few examples and every kernel
it starts is shut down at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

import jupyter_gpushare
from jupyter_gpushare.core import request_body

from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, start_server

pytestmark = pytest.mark.integration

OPENAPI = Path(jupyter_gpushare.__file__).parent / "openapi.yaml"
API = "/api/gpushare"
MAX_EXAMPLES = 25
STARTS_KERNELS = 6  # examples for POST kernels: the valid ones start real kernels

# No 5xx ever; and every answer has a documented status and fits the documented schema (the
# response objects forbid unknown keys, so drift between views.py and the document shows here).
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
            # The token is sent with every request (below); a generated or withheld
            # Authorization header would only ever meet the 403 in front of the handlers.
            "with-security-parameters": False,
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


def server_errors(server: JupyterServer) -> str:
    """The records of the server log with a traceback, and its 5xx lines, for the report."""
    records: list[str] = []
    for line in server.log().splitlines():
        if line.startswith("[") or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return "\n".join(
        record
        for record in records
        if "Traceback (most recent call last)" in record
        or re.search(r"\] 5\d\d (GET|POST|PATCH|DELETE|PUT) ", record)
    )


@pytest.fixture
def fuzz_server(node: Node) -> Iterator[JupyterServer]:
    """A fresh server per operation; stopping it shuts down any kernel a POST started."""
    server = start_server(node, "fuzz")
    yield server
    server.stop(timeout=10)
    found = server_errors(server)
    if found:
        print(f"---- server log: tracebacks and 5xx ----\n{found}")


def shut_down_started_kernel(server: JupyterServer, case: schemathesis.Case, response: Any) -> None:
    """Keep the pool empty between examples: a kernel that started is shut down at once."""
    if (case.method, case.path) == ("POST", "/kernels") and response.status_code == 201:
        server.request("DELETE", f"/api/kernels/{response.json()['kernel_id']}")


@SCHEMA.parametrize()
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzz_server: JupyterServer) -> None:
    response = case.call(base_url=f"{fuzz_server.url}{API}", headers=auth(fuzz_server), timeout=120)
    try:
        case.validate_response(response, checks=CHECKS, headers=auth(fuzz_server))
    finally:
        shut_down_started_kernel(fuzz_server, case, response)


# ---- the routes of one kernel, with ids of real kernels -------------------------------------------
# Random ids only ever reach the 404 of a kernel that does not exist; these reach the code behind.


def start_kernel(server: JupyterServer, name: str) -> str:
    reply = server.request("POST", f"{API}/kernels", {"name": name})
    assert reply.status in (201, 202), reply
    return str(reply.body["kernel_id"])


def fuzz_operation(server: JupyterServer, path: str, method: str, kernel_id: str) -> None:
    """``MAX_EXAMPLES`` valid and invalid requests to one operation, for one kernel."""
    operation = SCHEMA[path][method]
    fixed = {"kernel_id": kernel_id}
    strategy = operation.as_strategy(
        generation_mode=GenerationMode.POSITIVE, path_parameters=fixed
    ) | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, path_parameters=fixed)

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:
        assert case.path_parameters == fixed
        response = case.call(base_url=f"{server.url}{API}", headers=auth(server), timeout=120)
        case.validate_response(response, checks=CHECKS, headers=auth(server))

    fuzz()


def test_no_request_on_a_real_kernel_gets_a_server_error(node: Node, fuzz_server: JupyterServer) -> None:
    """Kernels in every state a client can reach, fuzzed through each operation of one kernel:
    released (its slice given back), running (30G), queued (a third 30G behind two), and
    withdrawn (queued, then its request released through DELETE kernels/{id}/gpu).

    One server for all: GET first, then PATCH (which resizes), DELETE last (which releases).
    """
    released = start_kernel(fuzz_server, "python3-gpu-4g")
    assert fuzz_server.request("DELETE", f"{API}/kernels/{released}/gpu").status == 204
    running = start_kernel(fuzz_server, "python3-gpu-30g")
    start_kernel(fuzz_server, "python3-gpu-30g")
    queued = start_kernel(fuzz_server, "python3-gpu-30g")
    withdrawn = start_kernel(fuzz_server, "python3-gpu-16g")
    assert fuzz_server.request("DELETE", f"{API}/kernels/{withdrawn}/gpu").status == 204
    # Withdrawn: the server forgets its start at once, and the cancelled start takes its request
    # out of the queue; fuzz what a client sees after that.
    assert fuzz_server.request("GET", f"{API}/kernels/{withdrawn}").status == 404
    wait_until(lambda: node.ledger.get(withdrawn) is None, 10, 0.1, "the withdrawn request out of the ledger")

    kernels = {"released": released, "running": running, "queued": queued, "withdrawn": withdrawn}
    failures: list[str] = []
    for path, method in (
        ("/kernels/{kernel_id}", "GET"),
        ("/kernels/{kernel_id}", "PATCH"),
        ("/kernels/{kernel_id}/gpu", "DELETE"),
    ):
        for state, kernel_id in kernels.items():
            try:
                fuzz_operation(fuzz_server, path, method, kernel_id)
            except (Exception, FailureGroup) as error:  # fuzz them all; report every failure
                report = "\n".join([str(error), *getattr(error, "__notes__", [])])
                failures.append(f"{method} {path} on the {state} kernel {kernel_id}:\n{report}")
    assert not failures, "\n\n".join(failures)


# ---- hostile bodies: deep nesting and odd unicode (issue 11) ---------------------------------------
# Schemathesis generates what the document describes; these strategies add what a parser or a
# database chokes on: JSON nested thousands deep, lone surrogates, controls, bidi marks and
# non-ASCII digits in every field, and bodies just over the size limit.

ODD_CHARACTERS = st.characters(categories=["Cs", "Cc", "Cf", "Co", "Nd", "Zs", "Lo"]) | st.sampled_from(
    ["\u0000", "\ud800", "\udfff", "\u202e", "\ufeff", "٤", "４", "%", "\\", '"', "\u2028"]
)
ODD_TEXT = st.text(ODD_CHARACTERS, max_size=12)
NESTED = st.integers(min_value=0, max_value=5000).map(lambda depth: "[" * depth + "]" * depth)


def odd_body(fields: dict[str, str], nested: str, oversize: bool) -> bytes:
    """A JSON object with odd strings (surrogates escaped as JSON allows) and one nested value."""
    text = json.dumps(fields)  # ensure_ascii: a lone surrogate travels as "\\ud800"
    body = text[:-1] + (", " if fields else "") + f'"nested": {nested or "null"}}}'
    if oversize:
        body += " " * (request_body.MAX_BODY_BYTES + 1 - len(body))
    return body.encode()


BODIES = st.builds(
    odd_body,
    st.fixed_dictionaries(
        # An odd size in every body: nothing a hostile body sends may start a kernel.
        {"gpu_memory": ODD_TEXT.map(lambda text: f"{text}٤G")},
        optional={
            "path": ODD_TEXT,
            "name": ODD_TEXT,
            "gpu_mode": ODD_TEXT,
            "gpu_cores": ODD_TEXT,
            "memory_used": ODD_TEXT,
            "restart": ODD_TEXT,
        },
    ),
    NESTED,
    st.booleans(),
)


def test_deep_and_odd_unicode_bodies_never_get_a_server_error(fuzz_server: JupyterServer) -> None:
    kernel_id = start_kernel(fuzz_server, "python3-gpu-4g")
    targets = [
        (method.upper(), path.replace("{kernel_id}", kernel_id))
        for path, methods in SCHEMA.raw_schema["paths"].items()
        for method, operation in methods.items()
        if isinstance(operation, dict) and "requestBody" in operation
    ]
    assert len(targets) >= 4  # POST kernels, PATCH kernels/{id}, the kernel pod's routes

    @given(body=BODIES, target=st.sampled_from(targets))
    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    def fuzz(body: bytes, target: tuple[str, str]) -> None:
        method, path = target
        answer = fuzz_server.request(method, f"{API}{path}", raw=body, timeout=60)
        assert answer.status < 500, (method, path, body[:120], answer)
        assert isinstance(answer.body, dict) and isinstance(answer.body.get("message"), str), answer

    fuzz()
    view = fuzz_server.request("GET", f"{API}/kernels/{kernel_id}").body
    assert view["memory_request"] == 4 * 2**30, "no hostile body changed the kernel's slice"
