"""The accounting of real kernels on a simulated pool (docs/admins/accounting.md), on the local backend.

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

from jupyter_gpushare.core.accounting.usage_report import local_time
from jupyter_gpushare.core.sizes import GiB

from ..support.kernels import kernel_manager
from ..support.nodes import BIN, Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server
from .test_openapi import Contract, load_document

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
        contract = Contract(load_document()).component("Usage")  # the OpenAPI document's shape
        assert list(contract.iter_errors(usage.body)) == []
        [row] = usage.body["rows"]
        assert row["key"] == kernel_id and row["label"] == f"{row['owner']}: {kernel_id[:8]} a.ipynb"
        assert (row["notebook"], row["kernelspec"]) == ("a.ipynb", "python3-gpu-4g")
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
        assert list(contract.iter_errors(json.loads(done.stdout))) == []
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


async def test_the_report_by_kernel_tells_each_kernel_apart_and_leaves_the_doctor_out(node: Node) -> None:
    """Kernels started outside JupyterLab (nbclient, papermill, a script) have no notebook: their
    rows said ``alice: python3-gpu-4g`` each, alike; the doctor's test kernel counted as a start."""
    kernels = kernel_manager()
    started = []
    try:
        for _ in range(3):
            kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
            started.append(kernel_id)
            await kernels.shutdown_kernel(kernel_id, now=True)
    finally:
        await kernels.shutdown_all(now=True)
    doctor = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "doctor"], env=node.env, capture_output=True, text=True, timeout=300
    )
    assert "OK    test kernel:" in doctor.stdout, doctor.stdout + doctor.stderr

    done = cli_report(node, "--since", "1h", "--by", "kernel", "--format", "json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert list(Contract(load_document()).component("Usage").iter_errors(payload)) == []
    assert sorted(row["key"] for row in payload["rows"]) == sorted(started)  # no doctor's kernel
    assert len({row["label"] for row in payload["rows"]}) == 3
    for row in payload["rows"]:
        assert row["label"] == f"{row['owner']}: {row['key'][:8]} no notebook (python3-gpu-4g)"
        assert (row["notebook"], row["kernelspec"], row["starts"]) == (None, "python3-gpu-4g", 1)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["started"]), row
    assert (payload["total"]["kernels"], payload["total"]["starts"]) == (3, 3)
    assert (payload["test_kernels"]["kernels"], payload["test_kernels"]["starts"]) == (1, 1)
    for moment in (payload["since"], payload["until"]):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", moment), moment

    table = cli_report(node, "--since", "1h", "--by", "kernel")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["kernel", "owner", "started", "notebook", "reserved"]
    for row in payload["rows"]:
        [line] = [line for line in lines if line.startswith(row["key"][:8])]
        assert local_time(row["started"]) in line and "no notebook (python3-gpu-4g)" in line
    assert "starts: slices placed" in table.stdout
    assert "Not in the figures above: the test kernels of jupyter gpushare doctor, 1 start(s)" in table.stdout
