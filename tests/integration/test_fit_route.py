"""``GET api/gpushare/fit``: the dry run the start picker shows, against a real server, and the
real starts that follow it (they must agree); bad input is a 400 that reserves nothing."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pytest

from jupyter_gpushare.core.sizes import GiB

from ..support.nodes import Node
from ..support.servers import JupyterServer, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


def fit(server: JupyterServer, *sizes: str, **extra: str) -> tuple[int, object]:
    query = urllib.parse.urlencode([("gpu_memory", size) for size in sizes] + list(extra.items()))
    answer = server.request("GET", f"{API}/fit?{query}")
    return answer.status, answer.body


def test_the_dry_run_and_the_starts_that_follow_agree(node: Node, server: JupyterServer) -> None:
    held = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g"})
    assert held.status == 201, held
    status, answers = fit(server, "2G", "60G", "96G")
    assert status == 200, answers
    assert isinstance(answers, list)
    assert [(a["gpu_memory"], a["verdict"], a["summary"]) for a in answers] == [
        ("2G", "now", "fits now on GPU0, 50G free"),
        ("60G", "queue", "queue position 1, wait unknown"),  # no slice has been held before
        ("96G", "never", "larger than any card"),
    ]
    assert answers[0]["memory_request"] == 2 * GiB and answers[0]["device"] == 0
    assert "does not fit: 50G free on GPU0" in answers[1]["reason"]
    assert [record.kernel_id for record in node.running()] == [held.body["kernel_id"]]  # nothing reserved

    # What the dry run said is what the starts do.
    queued = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": "60G"})
    assert queued.status == 202 and queued.body["queue_position"] == 1, queued
    # The queue is first in, first out: now even 2G waits, behind the 60G request.
    status, answers = fit(server, "2G")
    assert answers == [
        {
            "gpu_memory": "2G",
            "verdict": "queue",
            "summary": "queue position 2, wait unknown",
            "reason": "behind 1 earlier GPU request",
            "device": None,
            "node": None,
            "free": None,
            "memory_request": None,
            "queue_position": 2,
            "expected_start": None,
        }
    ]
    assert server.request("DELETE", f"{API}/kernels/{queued.body['kernel_id']}/gpu").status == 204
    started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": "2G"})
    assert started.status == 201 and started.body["memory_request"] == 2 * GiB, started
    # A restart keeps the picked size, not the kernelspec's.
    kernel_id = started.body["kernel_id"]
    assert server.request("POST", f"/api/kernels/{kernel_id}/restart").status == 200
    assert [r.memory for r in node.running() if r.kernel_id == kernel_id] == [2 * GiB]


def test_a_budget_shows_what_is_already_held(node: Node) -> None:
    node.write_server_config({"max_memory_per_user": "16G"})
    server = start_server(node, "budget")
    try:
        body = {"name": "python3-gpu-4g", "gpu_memory": "12G"}
        assert server.request("POST", f"{API}/kernels", body).status == 201
        status, answers = fit(server, "4G", "8G")
        assert status == 200
        assert [a["summary"] for a in answers] == [  # type: ignore[union-attr]
            "fits now on GPU0, 68G free",
            "above your 16G budget: 12G already held",
        ]
        refused = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": "8G"})
        assert refused.status == 409 and "per-user limit of 16G" in refused.body["message"]
    finally:
        server.stop()


BAD_QUERIES = [
    ("", "ask with ?gpu_memory=SIZE"),
    ("gpu_memory=abc", "cannot read GPU size 'abc'; accepted forms:"),
    ("gpu_memory=0", "must be more than zero"),
    ("gpu_memory=", "GPU size is empty"),
    ("gpu_memory=4G&gpu_mode=bogus", "bogus"),
    ("gpu_memory=4G&gpu_mode=vgpu&gpu_mode=mps", "gpu_mode may be given once"),
    ("gpu_memory=4G&gpu_cores=900", "gpu_cores must be from 1 to 100"),
    ("&".join(["gpu_memory=1G"] * 33), "at most 32 sizes"),
    ("gpu_memory=%FF", "Invalid unicode"),
]


def test_bad_input_is_a_400_with_a_message(node: Node, server: JupyterServer) -> None:
    for query, message in BAD_QUERIES:  # one server for all: a server per case costs seconds
        answer = server.request("GET", f"{API}/fit?{query}")
        assert answer.status == 400, (query, answer)
        assert message in answer.body["message"], (query, answer.body)
    assert node.running() == [] and node.queued() == []
