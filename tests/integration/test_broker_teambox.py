"""A team box (docs/broker.md): real OS users share one GPU broker, which alone holds the node ledger.

Two users made for the test, ``gpu-alice-…`` (two servers) and ``gpu-bob-…`` (one), run their jupyter
servers, kernels and scripts as themselves; the broker runs as root. One broker and three servers
serve the whole module (starting them costs seconds); each test sets up the kernels it needs.
The broker's limits: 8G per user, 7G per kernel, on one simulated 80G card.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.capabilities import LOCAL_BROKER
from jupyter_gpushare.core.payloads import KernelPayload
from jupyter_gpushare.core.sizes import GiB

from ..support.polling import wait_until
from ..support.servers import JupyterServer, Response, execute, wait_ready
from ..support.teambox import BIN, TeamBox, team_box

pytestmark = pytest.mark.integration

API = "/api/gpushare"
# Names of this run's own: two runs on one machine (a developer's and a helper's) never share,
# delete or kill each other's users.
RUN = secrets.token_hex(3)
ALICE, BOB = f"gpu-alice-{RUN}", f"gpu-bob-{RUN}"
RACE_ROUNDS = 20
BROKER_LIMITS = {"max_memory_per_user": "8G", "max_memory_per_kernel": "7G", "sample_interval": 0.5}


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    with team_box((ALICE, BOB), BROKER_LIMITS) as made:
        alice, bob = made.users[ALICE], made.users[BOB]
        servers = [
            made.server(alice, "one"),
            made.server(alice, "two"),
            # Bob claims to be alice and to have no limits: none of it may count.
            made.server(
                bob,
                "one",
                JUPYTER_GPUSHARE_OWNER=ALICE,
                JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER="80G",
                JUPYTER_GPUSHARE_MAX_MEMORY_PER_KERNEL="80G",
            ),
        ]
        for server in servers:
            wait_ready(server)
        yield made


def server_of(box: TeamBox, user: str, index: int = 0) -> JupyterServer:
    return [server for server in box.servers if f"-{user}-" in server.token][index]


def start(server: JupyterServer, name: str) -> Response:
    return server.request("POST", f"{API}/kernels", {"name": name}, timeout=120)


def admin_status(box: TeamBox) -> dict[str, Any]:
    """``jupyter gpushare status --json`` as root: the broker's admin sees every kernel."""
    done = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "status", "--json"],
        env={**os.environ, "JUPYTER_GPUSHARE_BROKER_URL": box.broker_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(done.stdout))


def kernels_of(box: TeamBox, owner: str) -> list[KernelPayload]:
    """Every slice of ``owner``'s, as the broker shows its admin (root, this test)."""
    admin = RemoteBackend(GPUShare(broker_url=box.broker_url, reconcile_on_start=False))
    return [kernel for kernel in admin.all_kernels() if kernel["owner"] == owner]


def shut_down_all(box: TeamBox, owner: str) -> None:
    """Shut down every kernel of ``owner``'s servers, and wait for the broker to see them gone."""
    for server in box.servers:
        if f"-{owner}-" in server.token:
            for kernel in server.request("GET", "/api/kernels").body:
                server.request("DELETE", f"/api/kernels/{kernel['id']}")
    wait_until(lambda: not kernels_of(box, owner), timeout=60)


def one_kernel(box: TeamBox, server: JupyterServer, name: str = "python3-gpu-4g") -> str:
    """The id of a running kernel of this server's (started if there is none)."""
    running = [view for view in server.request("GET", f"{API}/kernels").body if view["state"] == "running"]
    if running:
        return str(running[0]["kernel_id"])
    started = start(server, name)
    assert started.status == 201, started
    return str(started.body["kernel_id"])


def run(server: JupyterServer, kernel_id: str, code: str) -> str:
    import asyncio

    out, err = asyncio.run(execute(server, kernel_id, code))
    return out + err


# ---- the ledger belongs to the broker ----------------------------------------------------------


def test_the_ledger_is_the_brokers_alone_and_users_open_none(box: TeamBox) -> None:
    alice = box.users[ALICE]
    kernel_id = one_kernel(box, server_of(box, ALICE))
    for suffix in ("", "-wal", "-shm", ".lock"):
        info = os.stat(f"{box.ledger}{suffix}")
        assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o600, suffix
    opened = box.run_as(
        alice,
        f"""
        import json
        refused = []
        for suffix in ("", "-wal", "-shm", ".lock"):
            try:
                open({str(box.ledger)!r} + suffix, "r+b")
            except PermissionError:
                refused.append(suffix)
        print(json.dumps(refused))
        """,
    )
    assert opened == ["", "-wal", "-shm", ".lock"]
    # The servers, their kernels and their consoles asked the broker: no user has a ledger file.
    assert kernels_of(box, ALICE)[0]["kernel_id"] == kernel_id
    for user in box.users.values():
        assert not list(user.home.rglob("*ledger*")), user.name


# ---- each user sees and acts on their own kernels only -----------------------------------------


def test_users_see_and_act_on_their_own_kernels_only(box: TeamBox) -> None:
    alice_server, bob_server = server_of(box, ALICE), server_of(box, BOB)
    mine = one_kernel(box, alice_server)
    bobs = one_kernel(box, bob_server)

    # Through alice's server: her kernel in full, bob's as anonymous occupancy only.
    kernels = alice_server.request("GET", f"{API}/kernels").body
    assert [view["kernel_id"] for view in kernels] == [mine]
    # Bob's start reaches alice's server with the broker's next event (within a sample).
    pool = wait_until(
        lambda: (lambda p: p if p["devices"][0]["memory_reserved"] == 8 * GiB else None)(
            alice_server.request("GET", f"{API}/pool").body
        ),
        timeout=60,
    )
    assert bobs not in json.dumps(pool) + json.dumps(kernels)
    for method, path, body in (
        ("GET", f"{API}/kernels/{bobs}", None),
        ("PATCH", f"{API}/kernels/{bobs}", {"gpu_memory": "2G"}),
        ("DELETE", f"{API}/kernels/{bobs}/gpu", None),
    ):
        assert alice_server.request(method, path, body).status == 404, (method, path)

    # Through the broker directly, as alice: nothing of bob's can be changed or read.
    record = Ledger(box.ledger).get(bobs)
    assert record is not None and record.kernel is not None and record.owner == BOB
    answers = box.run_as(
        box.users[ALICE],
        f"""
        import json
        from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
        from jupyter_gpushare.config import load_settings
        from jupyter_gpushare.core.errors import GPUShareError
        broker = RemoteBackend(load_settings(from_files=False, reconcile=False))
        answers = {{"me": broker.info()["user"], "own_slice": repr(broker.own_slice({bobs!r}, None))}}
        for name, call in (
            ("resize", lambda: broker.resize({bobs!r}, "2G")),
            ("release", lambda: broker.give_back({bobs!r})),
            ("free", lambda: broker.free({bobs!r})),
            ("usage", lambda: broker.client.call("POST", "slices/{bobs}/usage", {{"memory_used": 1}})),
            ("attach bob's pid", lambda: broker.attach_kernel({mine!r}, {record.kernel.pid})),
            *(
                (f"attach pid {{pid}} at {{start}}", lambda pid=pid, start=start: broker.client.call(
                    "PUT", "slices/{mine}/kernel", {{"pid": pid, "start": start}}
                ))
                for pid, start in (
                    (2**40, 1.0), (2**63, 1.0), (2**64, 1.0), (1, float("nan")), (1, float("inf"))
                )
            ),
        ):
            try:
                call()
                answers[name] = "done"
            except GPUShareError as error:
                answers[name] = [error.status, str(error)]
        print(json.dumps(answers))
        """,
    )
    assert answers["me"] == ALICE and answers["own_slice"] == "None"
    for name in ("resize", "release", "free", "usage"):
        assert answers[name][0] == 404, (name, answers)
    status, message = answers["attach bob's pid"]
    assert status == 403 and f"process {record.kernel.pid} is not {ALICE}'s" in message
    # Her own slice, a process id past any pid_t or a start that is no time: a 400 that says so.
    hostile = {name: answer for name, answer in answers.items() if name.startswith("attach pid")}
    assert len(hostile) == 5 and all(answer[0] == 400 for answer in hostile.values()), hostile
    assert "there is no process 1099511627776" in hostile["attach pid 1099511627776 at 1.0"][1]
    after = Ledger(box.ledger).get(bobs)
    assert after is not None and after.memory == 4 * GiB and after.kernel == record.kernel
    mine_after = Ledger(box.ledger).get(mine)
    assert mine_after is not None and mine_after.kernel is not None
    assert mine_after.kernel.pid != record.kernel.pid

    # `jupyter gpushare status` as alice: bob's kernel is occupancy; as root (admin): everything.
    shown = box.run_as(
        box.users[ALICE],
        """
        import contextlib, io, json
        from jupyter_gpushare.cli import main
        text, data = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(text):
            main(["status"])
        with contextlib.redirect_stdout(data):
            main(["status", "--json"])
        print(json.dumps({"text": text.getvalue(), "json": json.loads(data.getvalue())}))
        """,
    )
    assert mine in shown["text"] and bobs not in shown["text"] and "another user" in shown["text"]
    assert {kernel["kernel_id"] for kernel in shown["json"]["kernels"]} == {mine, None}
    everything = admin_status(box)
    assert {(kernel["kernel_id"], kernel["owner"]) for kernel in everything["kernels"]} == {
        (mine, ALICE),
        (bobs, BOB),
    }

    # The magics: alice's kernel sees its own slice, and bob's as reserved memory only.
    seen = run(alice_server, mine, "%gpu") + run(alice_server, mine, "%gpu pool")
    assert "GPU slice: 4G" in seen and "reserved 8G" in seen and bobs not in seen, seen


def test_identity_and_limits_come_from_the_broker(box: TeamBox) -> None:
    bob_server = server_of(box, BOB)
    bobs = one_kernel(box, bob_server)
    # Bob's server runs with JUPYTER_GPUSHARE_OWNER set to alice's name and limits of 80G: the broker
    # knows him by his uid and holds him to its own limits.
    assert {kernel["owner"] for kernel in kernels_of(box, BOB)} == {BOB}
    assert not [kernel for kernel in kernels_of(box, ALICE) if kernel["kernel_id"] == bobs]
    too_big = start(bob_server, "python3-gpu-12g")
    assert too_big.status == 409 and "per-kernel limit of 7G" in too_big.body["message"], too_big.body
    over_budget = start(bob_server, "python3-gpu-6g")
    assert over_budget.status == 409 and "per-user limit of 8G" in over_budget.body["message"]
    # Inside his kernel, changing the settings the kernel was given changes nothing either.
    seen = run(
        bob_server,
        bobs,
        "import os\n"
        f"os.environ['JUPYTER_GPUSHARE_OWNER'] = {ALICE!r}\n"
        "os.environ['JUPYTER_GPUSHARE_MAX_MEMORY_PER_KERNEL'] = '80G'\n"
        "os.environ['JUPYTER_GPUSHARE_MAX_MEMORY_PER_USER'] = '80G'\n"
        "%gpu release\n%gpu request 7.5G",
    )
    assert "per-kernel limit of 7G" in seen, seen
    seen = run(bob_server, bobs, "%gpu request 5G")
    assert "GPU slice: 5G" in seen, seen
    [held] = kernels_of(box, BOB)
    assert held["kernel_id"] == bobs and held["memory_request"] == 5 * GiB


# ---- one budget, several servers, the same instant ---------------------------------------------


def at_once(calls: list[Any]) -> list[Any]:
    """Every call's answer, the calls made in threads released at the same instant."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = []

    def call(make: Any) -> None:
        barrier.wait()
        answers.append(make())

    threads = [threading.Thread(target=call, args=(make,)) for make in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_two_servers_starting_at_once_under_one_budget_exactly_one_wins(box: TeamBox) -> None:
    first, second = server_of(box, ALICE, 0), server_of(box, ALICE, 1)
    shut_down_all(box, ALICE)
    for round_ in range(RACE_ROUNDS):
        answers = at_once([lambda: start(first, "python3-gpu-6g"), lambda: start(second, "python3-gpu-6g")])
        statuses = sorted(answer.status for answer in answers)
        assert statuses == [201, 409], (round_, [answer.body for answer in answers])
        refused = next(answer for answer in answers if answer.status == 409)
        assert "per-user limit of 8G" in refused.body["message"]
        assert [kernel["memory_request"] for kernel in kernels_of(box, ALICE)] == [6 * GiB]
        winner = next(answer for answer in answers if answer.status == 201).body["kernel_id"]
        for server in (first, second):
            server.request("DELETE", f"/api/kernels/{winner}")
        wait_until(lambda: not kernels_of(box, ALICE), timeout=60)


# ---- nobody reads another user's kernel off the wire -------------------------------------------


def test_another_user_reads_nothing_of_a_kernels_traffic(box: TeamBox) -> None:
    alice_server = server_of(box, ALICE)
    kernel_id = one_kernel(box, alice_server)
    connection_file = box.users[ALICE].home / "runtime" / f"kernel-{kernel_id}.json"
    connection = json.loads(connection_file.read_text())
    assert connection["curve_publickey"] and connection["curve_secretkey"]  # it is encrypted
    iopub = f"tcp://{connection['ip']}:{connection['iopub_port']}"
    # Bob subscribes to alice's iopub port for as long as alice's kernel prints, and reports
    # every byte he received.
    listener = subprocess.Popen(
        [
            str(box.python),
            "-c",
            "import json, sys, zmq\n"
            "socket = zmq.Context().socket(zmq.SUB)\n"
            "socket.setsockopt(zmq.SUBSCRIBE, b'')\n"
            f"socket.connect({iopub!r})\n"
            "print('listening', flush=True)\n"
            "received = []\n"
            "poller = zmq.Poller()\n"
            "poller.register(socket, zmq.POLLIN)\n"
            "poller.register(sys.stdin, zmq.POLLIN)\n"
            "while True:\n"
            "    ready = dict(poller.poll())\n"
            "    if socket in ready:\n"
            "        received.append(b''.join(socket.recv_multipart()).decode('latin-1'))\n"
            "    if sys.stdin.fileno() in ready:\n"
            "        break\n"
            "print(json.dumps(received))\n",
        ],
        env=box.env_for(box.users[BOB]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **box.users[BOB].popen_arguments(),
    )
    assert listener.stdout is not None and listener.stdin is not None
    assert listener.stdout.readline().strip() == "listening"
    marker = "SECRET-OUTPUT-OF-ALICE"
    seen = run(
        alice_server,
        kernel_id,
        f"import time\nfor i in range(10):\n    print('{marker}', i); time.sleep(0.1)",
    )
    assert seen.count(marker) == 10  # alice's own connection reads it
    listener.stdin.write("done\n")
    listener.stdin.flush()
    received = json.loads(listener.stdout.readline())
    listener.wait(timeout=30)
    assert received == [], received[:3]


# ---- everything of the REST API, the stream and the magics works through the broker -------------


def test_rest_api_stream_and_magics_through_the_broker(box: TeamBox) -> None:
    server = server_of(box, ALICE, 1)
    shut_down_all(box, ALICE)
    started = start(server, "python3-gpu-4g")
    assert started.status == 201 and started.body["owner"] == ALICE, started.body
    kernel_id = started.body["kernel_id"]
    # What the broker offers (its info answer; the panel's buttons follow): no suspend, no forced
    # shrink.
    view = server.request("GET", f"{API}/kernels/{kernel_id}").body
    assert view["capabilities"] == LOCAL_BROKER.payload(), view
    resized = server.request("PATCH", f"{API}/kernels/{kernel_id}", {"gpu_memory": "6G"})
    assert resized.status == 200 and resized.body["memory_request"] == 6 * GiB
    refused = server.request("PATCH", f"{API}/kernels/{kernel_id}", {"gpu_memory": "9G"})
    assert refused.status == 409 and "per-kernel limit of 7G" in refused.body["message"]
    assert server.request("GET", f"{API}/config").status == 200
    # The start picker's dry run, answered by the broker with alice's budget (8G, 6G held now).
    fit = server.request("GET", f"{API}/fit?gpu_memory=2G&gpu_memory=4G")
    assert fit.status == 200, fit.body
    assert [entry["verdict"] for entry in fit.body] == ["now", "never"], fit.body
    assert "per-user limit of 8G" in str(fit.body[1]["reason"])

    request = urllib.request.Request(
        f"{server.url}{API}/stream", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        data = next(line for line in reply if line.startswith(b"data: "))
    event = json.loads(data[6:])
    assert [view["kernel_id"] for view in event["kernels"]] == [kernel_id]

    seen = run(server, kernel_id, "%gpu resize 3G")
    seen += run(server, kernel_id, "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])")
    assert "GPU slice: 3G" in seen and str(3 * GiB) in seen, seen
    # Suspend/resume and forced shrinks need the node ledger itself: a broker says so, no change.
    seen = run(server, kernel_id, "%gpu suspend")
    assert "not available through a GPU broker yet: nothing was changed" in seen, seen
    refused = server.request("POST", f"{API}/kernels/{kernel_id}/suspend")
    assert refused.status == 409 and "through a GPU broker" in refused.body["message"], refused
    seen = run(server, kernel_id, "%gpu release")
    assert "Released 3G" in seen, seen
    # The kernel told the broker itself; the server hears of it with the broker's next event.
    wait_until(
        lambda: server.request("GET", f"{API}/kernels/{kernel_id}").body["state"],
        timeout=30,
        message="the server's view of the released kernel",
        until=lambda state: state == "released",
    )
    seen = run(server, kernel_id, "%gpu request 2G")
    assert "GPU slice: 2G" in seen, seen
    assert server.request("DELETE", f"{API}/kernels/{kernel_id}/gpu").status == 204
    assert not kernels_of(box, ALICE)


def test_nbclient_as_a_user_takes_its_slice_from_the_broker(box: TeamBox) -> None:
    """A notebook run by nbclient (no server) as bob: the kernel's slice comes from the broker,
    counted against bob's budget, and is gone after the run."""
    shut_down_all(box, BOB)
    seen = box.run_as(
        box.users[BOB],
        """
        import json, os
        import nbformat
        from nbclient import NotebookClient
        from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
        from jupyter_gpushare.config import load_settings
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(
            "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])")]
        broker = RemoteBackend(load_settings(from_files=False, reconcile=False))
        during = []
        client = NotebookClient(notebook, kernel_name="python3-gpu-4g", timeout=60)
        client.on_cell_executed = lambda **_: during.append(
            [(k["owner"], k["memory_request"]) for k in broker.all_kernels() if k["kernel_id"]])
        client.execute()
        print(json.dumps({"out": notebook.cells[0].outputs[0]["text"], "during": during,
                          "after": broker.all_kernels()}))
        """,
    )
    assert seen["out"].strip() == str(4 * GiB)
    assert seen["during"] == [[[BOB, 4 * GiB]]]
    assert seen["after"] == [] and not kernels_of(box, BOB)


# ---- the broker goes away, and comes back ------------------------------------------------------


def test_broker_down_fails_starts_at_once_and_a_restart_loses_nothing(box: TeamBox) -> None:
    alice_server = server_of(box, ALICE)
    kernel_id = one_kernel(box, alice_server)
    before = Ledger(box.ledger).get(kernel_id)
    assert before is not None and before.state == "running"
    box.kill_broker()
    try:
        began = time.monotonic()
        refused = start(alice_server, "python3-gpu-4g")
        assert refused.status == 503, refused.body
        assert f"the GPU broker at {box.broker_url} is not reachable" in refused.body["message"]
        assert time.monotonic() - began < 20, "failed at once, did not hang"
        wait_until(lambda: alice_server.request("GET", f"{API}/pool").status == 503, timeout=60)
        # The running kernel runs on.
        assert "42" in run(alice_server, kernel_id, "print(6 * 7)")
    finally:
        box.start_broker()
    # The restarted broker rebuilt its state from the ledger: the kernel and its slice are there.
    after = Ledger(box.ledger).get(kernel_id)
    assert after is not None and (after.state, after.memory, after.kernel) == (
        "running",
        before.memory,
        before.kernel,
    )
    views = alice_server.request("GET", f"{API}/kernels").body
    assert [(view["kernel_id"], view["state"]) for view in views] == [(kernel_id, "running")]


# ---- bad input -------------------------------------------------------------------------------------

BAD_INPUT = [
    ("POST", "slices", None, b"not json"),
    ("POST", "slices", ["a", "list"], None),
    ("POST", "slices", {"gpu_memory": "4G"}, None),  # no kernel id
    ("POST", "slices", {"kernel_id": "k", "gpu_memory": "lots"}, None),
    ("POST", "slices", {"kernel_id": "k", "gpu_memory": True}, None),
    ("POST", "slices", {"kernel_id": "k", "gpu_mode": "warp"}, None),
    ("POST", "slices", {"kernel_id": "k", "gpu_cores": 1000}, None),
    ("POST", "slices", {"kernel_id": "k", "token_hash": "short"}, None),
    ("POST", "slices", {"kernel_id": "x" * 1000}, None),
    ("POST", "slices/none-such/place", {}, None),
    ("PATCH", "slices/none-such", {"gpu_memory": "2G"}, None),
    ("PATCH", "slices/none-such", {"gpu_memory": None}, None),
    ("PATCH", "slices/none-such", {"restart": True}, None),
    ("PUT", "slices/none-such/kernel", {"pid": "1"}, None),
    ("PUT", "slices/none-such/kernel", {"pid": 1, "start": "yesterday"}, None),
    ("POST", "slices/none-such/usage", {"memory_used": -1}, None),
    ("POST", "slices/none-such/usage", {"memory_used": 1, "utilization": 101}, None),
    ("POST", "slices/none-such/usage", {"memory_used": 1, "source": "nvml"}, None),
    ("POST", "check", {"gpu_memory": "0G"}, None),
    ("POST", "check", {"gpu_memory": "900G"}, None),
    ("POST", "check", {"kernel_id": 5}, None),
    ("POST", "server-kernels", {"kernels": {"names": {"a": 1}}}, None),
    ("DELETE", "slices/none-such/gpu", None, None),
    ("GET", "no/such/route", None, None),
    ("POST", "pods", {"kernel_id": "k"}, None),  # a local broker makes no pods
]


def test_every_broker_route_refuses_bad_input_with_a_4xx_and_changes_nothing(box: TeamBox) -> None:
    from jupyter_gpushare.backends.broker_client.transport import BrokerAddress

    before = [(kernel["kernel_id"], kernel["memory_request"]) for kernel in kernels_of(box, ALICE)]
    for method, route, body, raw in BAD_INPUT:
        connection = BrokerAddress(box.broker_url).connection(30)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        connection.request(method, BrokerAddress(box.broker_url).path(route), body=data)
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
        connection.close()
        assert 400 <= response.status < 500 and answer.get("message"), (
            method,
            route,
            response.status,
            answer,
        )
    assert [(kernel["kernel_id"], kernel["memory_request"]) for kernel in kernels_of(box, ALICE)] == before
    assert "Traceback" not in box.broker_log()
