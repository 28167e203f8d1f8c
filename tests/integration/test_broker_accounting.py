"""Fair share and the accounting through one GPU broker (docs/broker.md, docs/admins/accounting.md),
with real OS users.

Two users made for the test, ``gpu-fair-alice-…`` and ``gpu-fair-bob-…``, run their servers and
real kernels as themselves; the broker (root's) holds the ledger with ``queue_policy = "fair"``
on one simulated 80 GiB card. Root (the broker's admin, this test) holds what blocks the card.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.slice_request import make_slice_request

from ..support.polling import wait_until
from ..support.servers import JupyterServer, Response, execute, wait_ready
from ..support.teambox import BIN, TeamBox, team_box

pytestmark = pytest.mark.integration

API = "/api/gpushare"
RUN = secrets.token_hex(3)
ALICE, BOB = f"gpu-fair-alice-{RUN}", f"gpu-fair-bob-{RUN}"
AGE_BOUND = 60.0  # seconds: long enough to queue six starts and place five, short enough to wait out
FAIR = {"queue_policy": "fair", "queue_age_bound": AGE_BOUND, "sample_interval": 0.5}
KERNEL = "python3-gpu-12g"


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    with team_box((ALICE, BOB), FAIR) as made:
        for user in (ALICE, BOB):
            wait_ready(made.server(made.users[user], "one"))
        yield made


def server_of(box: TeamBox, user: str) -> JupyterServer:
    return next(server for server in box.servers if f"-{user}-" in server.token)


def start(server: JupyterServer) -> Response:
    return server.request("POST", f"{API}/kernels", {"name": KERNEL}, timeout=120)


def views(server: JupyterServer) -> dict[str, dict[str, Any]]:
    return {view["kernel_id"]: view for view in server.request("GET", f"{API}/kernels").body}


def shut_down_all(server: JupyterServer) -> bool:
    """Withdraw the server's queued starts and shut its kernels down; True once none is left."""
    for kernel_id, view in views(server).items():
        if view["state"] == "queued":
            server.request("DELETE", f"{API}/kernels/{kernel_id}/gpu")
        else:
            server.request("DELETE", f"/api/kernels/{kernel_id}")
    return not views(server)


# Root's slice that fills the card while the queue forms (kernel ids are UUIDs at every door).
BLOCKER = "5d0c7a52-6b1e-4c8e-9d3f-0a1b2c3d4e5f"


def block(box: TeamBox, size: str) -> RemoteBackend:
    """Root (the broker's admin, this process) takes ``size`` of the card."""
    broker = RemoteBackend(GPUShare(broker_url=box.broker_url, reconcile_on_start=False))
    request = make_slice_request(size, "timeslice", None, "4G", "timeslice")
    asyncio.run(broker.acquire(BLOCKER, request))
    return broker


def test_one_waiting_start_goes_before_another_users_fifth_and_no_start_starves(box: TeamBox) -> None:
    alice, bob = server_of(box, ALICE), server_of(box, BOB)
    first = start(bob)  # bob has used the card (a kernel running) before anyone waits
    assert first.status == 201, first
    blocker = block(box, "68G")
    try:
        bobs = []
        for _ in range(5):
            answer = start(bob)
            assert answer.status == 202, answer  # queued
            bobs.append(answer.body["kernel_id"])
        answer = start(alice)
        assert answer.status == 202, answer
        alices = [answer.body["kernel_id"]]

        # Under fair share, alice's one start (no recent use) is first in line; bob's five follow
        # in the order he made them. Every view says so, and why.
        def positions() -> dict[str, int] | None:
            seen = {
                k: v["queue_position"]
                for k, v in {**views(alice), **views(bob)}.items()
                if v["state"] == "queued"
            }
            return seen if seen.get(alices[0]) == 1 else None

        seen = wait_until(positions, timeout=120)
        assert [seen[kernel_id] for kernel_id in bobs] == [2, 3, 4, 5, 6]
        queued = views(bob)[bobs[0]]
        assert "expected_start" in queued  # estimated (null: no finished hold to go by yet)
        fit = bob.request("GET", f"{API}/fit?gpu_memory=12G").body[0]
        assert fit["verdict"] == "queue" and fit["queue_position"] == 7
        assert "under fair share" in fit["reason"] and "wait unknown" in fit["summary"], fit

        # Room for five 12G slices: alice's goes first, bob's fifth still waits.
        blocker.free(BLOCKER)
        wait_until(lambda: views(bob)[bobs[3]]["state"] == "running", timeout=120)
        assert views(alice)[alices[0]]["state"] == "running"
        assert views(bob)[bobs[4]]["state"] == "queued"

        # A younger start of the user with less use goes before bob's fifth — until the fifth
        # has waited the age bound: from then on it is first, whoever comes.
        answer = start(alice)
        assert answer.status == 202, answer
        alices.append(answer.body["kernel_id"])
        assert views(alice)[alices[1]]["queue_position"] == 1
        wait_until(lambda: views(bob)[bobs[4]]["queue_position"] == 1, timeout=AGE_BOUND * 3)
        # Each server follows the broker on a feed of its own: alice's may learn a moment later.
        wait_until(lambda: views(alice)[alices[1]]["queue_position"] == 2, timeout=60)
        assert bob.request("DELETE", f"/api/kernels/{bobs[0]}").status == 204
        wait_until(lambda: views(bob)[bobs[4]]["state"] == "running", timeout=120)
        assert views(alice)[alices[1]]["state"] == "queued"
    finally:
        blocker.free(BLOCKER)
        wait_until(lambda: shut_down_all(alice) and shut_down_all(bob), timeout=120, interval=1)


def report_as(box: TeamBox, user: str, *arguments: str) -> dict[str, Any]:
    code = f"""
        import contextlib, io, json
        from jupyter_gpushare.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["report", "--format", "json", *{list(arguments)!r}])
        print(json.dumps(json.loads(out.getvalue())))
        """
    return dict(box.run_as(box.users[user], code))


def test_a_user_reads_their_own_figures_and_the_admin_everyones(box: TeamBox) -> None:
    alice, bob = server_of(box, ALICE), server_of(box, BOB)
    for server in (alice, bob):  # each has run a kernel (the test above, or now)
        answer = start(server)
        assert answer.status == 201, answer
        kernel_id = answer.body["kernel_id"]
        asyncio.run(execute(server, kernel_id, "x = 1"))
        # The kernel tells the broker its cells (with its own token): its row says it is idle.
        wait_until(lambda: views(server)[kernel_id].get("idle_since"), timeout=60)  # noqa: B023
        server.request("DELETE", f"/api/kernels/{kernel_id}")
    # Every kernel gone: the figures stand still while they are compared.
    wait_until(lambda: shut_down_all(alice) and shut_down_all(bob), timeout=120, interval=1)
    mine = alice.request("GET", f"{API}/usage?since=1d&by=kernel").body
    assert mine["scope"] == "self" and mine["rows"]
    assert {row["label"].split(":")[0] for row in mine["rows"]} == {ALICE}
    assert BOB not in json.dumps(mine)
    assert [row["key"] for row in alice.request("GET", f"{API}/usage?since=1d").body["rows"]] == [ALICE]
    assert [row["key"] for row in bob.request("GET", f"{API}/usage?since=1d").body["rows"]] == [BOB]
    groups = bob.request("GET", f"{API}/usage?since=1d&by=group").body
    assert [row["key"] for row in groups["rows"]] == ["(no group)"]  # groups come from the hub

    # The command line as alice: herself; as root (the broker's admin): everyone.
    assert [row["key"] for row in report_as(box, ALICE, "--since", "1d")["rows"]] == [ALICE]
    done = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "report", "--since", "1d", "--format", "json"],
        env={**os.environ, "JUPYTER_GPUSHARE_BROKER_URL": box.broker_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    everyone = json.loads(done.stdout)
    assert everyone["scope"] == "everyone"
    assert {ALICE, BOB} <= {row["key"] for row in everyone["rows"]}  # (and root's blocker)
    by_user = {row["key"]: row for row in everyone["rows"]}
    alice_now = alice.request("GET", f"{API}/usage?since=1d").body["rows"][0]
    assert alice_now == by_user[ALICE]

    # Alice's server's counters carry her figures only.
    import urllib.request

    request = urllib.request.Request(
        f"{alice.url}/metrics", headers={"Authorization": f"token {alice.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read().decode()
    assert f'jupyter_gpushare_reserved_byte_seconds_total{{owner="{ALICE}"}}' in text
    assert BOB not in text


BAD_INPUT = [
    ("GET", "usage?since=7y", None),
    ("GET", "usage?since=0d", None),
    ("GET", "usage?by=team", None),
    ("GET", "usage?by=user&by=group", None),
    ("POST", "slices/none-such/activity", b"not json"),
    ("POST", "slices/none-such/activity", {"busy": "yes", "at": 0}),
    ("POST", "slices/none-such/activity", {"busy": True, "at": 0}),  # not within the last hour
    ("POST", "slices/none-such/activity", {"busy": True, "at": "now"}),
    ("POST", "slices/none-such/activity", {"busy": False, "at": 1e12, "idle_after": 5}),
    ("POST", "slices/none-such/activity", {"busy": False, "at": None, "idle_after": -1}),
    ("POST", "slices/none-such/activity", {"busy": False, "at": None, "idle_action": "kill"}),
]


def test_the_accounting_routes_refuse_bad_input_with_a_4xx_and_record_nothing(box: TeamBox) -> None:
    import time

    from jupyter_gpushare.backends.broker_client.transport import BrokerAddress
    from jupyter_gpushare.backends.local.ledger import Ledger

    address = BrokerAddress(box.broker_url)
    for method, route, body in BAD_INPUT:
        if isinstance(body, dict) and body.get("at") is None and "at" in body:
            body = {**body, "at": time.time()}
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        connection = address.connection(30)
        connection.request(method, address.path(route), body=data)
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
        connection.close()
        assert 400 <= response.status < 500 and answer.get("message"), (
            method,
            route,
            response.status,
            answer,
        )
    recorded = Ledger(box.ledger).read_with(
        lambda db: db.execute("SELECT COUNT(*) FROM acct_activity WHERE kernel_id = 'none-such'").fetchone()
    )
    assert recorded[0] == 0
    assert "Traceback" not in box.broker_log()
