"""The accounting of real kernels on a simulated pool (SPEC §15), on the local backend.

A scripted session — a kernel started, a busy cell, memory declared in use, an idle spell, a
resize, a shutdown — is accounted as what was held and used, to the sampling interval; and
``GET usage``, ``jupyter gpushare report`` and the ``/metrics`` counters say the same.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from jupyter_gpushare.sizes import GiB

from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
SAMPLE = 0.5
DECLARE = "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('1G')"


async def timed(server: JupyterServer, kernel_id: str, code: str) -> tuple[float, float]:
    before = time.time()
    _, err = await execute(server, kernel_id, code)
    assert "Error" not in err, err
    return before, time.time()


def counters(server: JupyterServer) -> dict[str, float]:
    import urllib.request

    request = urllib.request.Request(
        f"{server.url}/metrics", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read().decode()
    found = re.findall(r'^(jupyter_gpushare_\w+_total)\{owner="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    return {name: float(value) for name, _, value in found}


def cli_report(node: Node, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "jupyter-gpushare"), "report", *arguments],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_scripted_session_is_accounted_and_report_rest_and_metrics_agree(node: Node) -> None:
    node.write_server_config({"sample_interval": SAMPLE, "idle_release_after": 3600})
    server = start_server(node, "accounting")
    try:
        started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "path": "a.ipynb"})
        assert started.status == 201, started
        kernel_id = started.body["kernel_id"]
        record = node.ledger.get(kernel_id)
        assert record is not None and record.placed_at is not None
        placed = record.placed_at
        busy_cells = [await timed(server, kernel_id, "import time; time.sleep(1.5)")]
        declared = await timed(server, kernel_id, DECLARE)
        busy_cells.append(declared)

        # The kernel says it is idle, and what its idle timer will do: the row can tell.
        def idle_view() -> dict | None:
            [view] = server.request("GET", f"{API}/kernels").body
            return view if view.get("idle_since") and view["idle_since"] >= declared[0] else None

        view = wait_until(idle_view, timeout=60)
        assert view["idle_action"] == "suspend"
        assert view["idle_action_at"] == pytest.approx(view["idle_since"] + 3600)

        resize_before = time.time()
        resized = server.request("PATCH", f"{API}/kernels/{kernel_id}", {"gpu_memory": "6G"})
        resize_after = time.time()
        assert resized.status == 200, resized
        time.sleep(1.0)
        end_before = time.time()
        assert server.request("DELETE", f"/api/kernels/{kernel_id}").status == 204
        end_after = time.time()
        wait_until(lambda: node.ledger.get(kernel_id) is None and node.ledger.released(kernel_id) is None)

        usage = server.request("GET", f"{API}/usage?since=1h&by=kernel")
        assert usage.status == 200, usage
        assert usage.body["scope"] == "self"
        [row] = usage.body["rows"]
        assert row["key"] == kernel_id and row["label"].endswith(": a.ipynb")
        slack = SAMPLE  # to the sampling interval
        reserved = row["reserved_gib_hours"] * 3600  # GiB x seconds
        low = 4 * (resize_before - placed) + 6 * (end_before - resize_after)
        high = 4 * (resize_after - placed) + 6 * (end_after - resize_before)
        assert low - 6 * slack <= reserved <= high + 6 * slack, (low, reserved, high)
        used = row["used_gib_hours"] * 3600
        assert (end_before - declared[1]) - slack <= used <= (end_after - declared[0]) + slack
        busy = row["busy_hours"] * 3600
        assert 1.5 <= busy <= sum(after - before for before, after in busy_cells) + slack
        held = (row["busy_hours"] + row["idle_hours"]) * 3600
        assert (end_before - placed) - slack <= held <= (end_after - placed) + slack
        assert (row["starts"], row["suspends"], row["resumes"]) == (1, 0, 0)

        # The same figures by user, through the REST API, the command line and the counters.
        [by_user] = server.request("GET", f"{API}/usage?since=1d").body["rows"]
        done = cli_report(node, "--since", "1d", "--format", "json")
        assert done.returncode == 0, done.stderr
        [from_cli] = json.loads(done.stdout)["rows"]
        assert from_cli == by_user
        metrics = counters(server)
        assert metrics["jupyter_gpushare_reserved_byte_seconds_total"] == pytest.approx(
            by_user["reserved_gib_hours"] * GiB * 3600, rel=1e-9
        )
        assert metrics["jupyter_gpushare_used_byte_seconds_total"] == pytest.approx(
            by_user["used_gib_hours"] * GiB * 3600, rel=1e-9
        )
        assert metrics["jupyter_gpushare_busy_seconds_total"] == pytest.approx(by_user["busy_hours"] * 3600)
        assert metrics["jupyter_gpushare_starts_total"] == 1
        table = cli_report(node, "--since", "1d")
        assert table.returncode == 0 and by_user["key"] in table.stdout and "total" in table.stdout
    finally:
        server.stop()


def test_bad_report_arguments_are_one_sentence_and_read_nothing(node: Node) -> None:
    server = start_server(node, "accounting-bad")
    try:
        for query, sentence in (
            ("since=7y", "since must be a duration such as 7d"),
            ("by=team", "by must be one of user, group, kernel"),
            ("since=1d&since=2d", "since may be given once"),
        ):
            answer = server.request("GET", f"{API}/usage?{query}")
            assert answer.status == 400 and sentence in answer.body["message"], (query, answer)
    finally:
        server.stop()
    for arguments, sentence in (
        (("--since", "yesterday"), "--since must be a duration"),
        (("--by", "team"), "--by must be one of user, group, kernel"),
        (("--format", "xml"), "--format takes one of table, csv, json, not 'xml'"),
    ):
        done = cli_report(node, *arguments)
        assert done.returncode == 2, done
        assert done.stderr.strip().splitlines() == [f"jupyter gpushare: error: {sentence}"] or (
            sentence in done.stderr and len(done.stderr.strip().splitlines()) == 1
        ), done.stderr
