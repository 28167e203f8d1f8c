"""The broker's door, tried as an attacker would (issue #20): two real OS users on one team-box
broker, code running inside their kernels, hostile bodies and headers on the socket, a broker
killed while starts wait, and a ledger made read-only under a server (the flood of idle
connections: test_broker_flood.py).

The users ``gpu-ann-…`` and ``gpu-ben-…`` are made for the module and removed after it; the broker
runs as root over one simulated 80G card, with no per-user limits (the sizes here are large).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import select
import socket
import sqlite3
import subprocess
import textwrap
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.core.records import SliceRecord
from jupyter_gpushare.core.sizes import GiB

from ..support.polling import wait_until
from ..support.servers import JupyterServer, Response, execute, wait_ready
from ..support.teambox import BIN, OSUser, TeamBox, team_box

pytestmark = pytest.mark.integration

API = "/api/gpushare"
RUN = secrets.token_hex(3)
ANN, BEN = f"gpu-ann-{RUN}", f"gpu-ben-{RUN}"
WAITING_LEASE = 8  # seconds the broker keeps a waiting request nobody asks after (its config)
GENEROUS = 120  # seconds: what a busy 2-core machine may take for a kernel to start or be placed

# A client of the broker's socket that sends exactly the bytes it is given, as the user it runs as,
# and reports each answer (or what became of the connection): [[status, body], ...].
RAW_CLIENT = textwrap.dedent(
    """
    import base64, http.client, json, sys
    from jupyter_gpushare.backends.broker_client.transport import BrokerAddress
    address = BrokerAddress(sys.argv[1])
    answers = []
    for ask in json.load(sys.stdin):
        connection = address.connection(120)
        try:
            body = None if ask["body"] is None else base64.b64decode(ask["body"])
            connection.request(ask["method"], address.path(ask["route"]), body=body,
                               headers=ask["headers"])
            response = connection.getresponse()
            text = response.read()
            try:
                answers.append([response.status, json.loads(text)])
            except ValueError:
                answers.append([response.status, text.decode(errors="replace")])
        except (OSError, http.client.HTTPException) as error:
            answers.append([None, repr(error)])
        finally:
            connection.close()
    print(json.dumps(answers))
    """
)


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    with team_box((ANN, BEN), {}, broker={"waiting_lease": WAITING_LEASE}) as made:
        for user in (ANN, BEN):
            made.server(made.users[user], "one")
        for server in made.servers:
            wait_ready(server)
        yield made


def server_of(box: TeamBox, user: str) -> JupyterServer:
    return next(server for server in box.servers if server.token == f"token-{user}-one")


def start(server: JupyterServer, memory: str, **fields: Any) -> Response:
    return server.request(
        "POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": memory, **fields}, timeout=GENEROUS
    )


def started(server: JupyterServer, memory: str) -> str:
    answer = start(server, memory)
    assert answer.status == 201, answer
    return str(answer.body["kernel_id"])


def run(server: JupyterServer, kernel_id: str, code: str) -> str:
    import asyncio

    out, err = asyncio.run(execute(server, kernel_id, code, timeout=GENEROUS))
    return out + err


def shut_down_everything(box: TeamBox) -> None:
    def shut_down_listed() -> list[SliceRecord]:
        # Asked again until the ledger is empty: a start placed a moment ago is listed among the
        # server's kernels only once its kernel process is up.
        for server in box.servers:
            if server.process.poll() is None:
                listed = server.request("GET", "/api/kernels")
                assert listed.status == 200, f"GET /api/kernels: {listed}"
                for kernel in listed.body:
                    server.request("DELETE", f"/api/kernels/{kernel['id']}")
        return Ledger(box.ledger).records()

    wait_until(shut_down_listed, GENEROUS, message="an empty ledger", until=lambda records: not records)


def raw_calls(box: TeamBox, user: OSUser, asks: list[tuple[str, str, bytes | None, dict[str, str]]]) -> Any:
    """Each ``(method, route, body, headers)`` sent to the broker as ``user``, byte for byte."""
    done = subprocess.run(
        [str(box.python), "-c", RAW_CLIENT, box.broker_url],
        input=json.dumps(
            [
                {
                    "method": method,
                    "route": route,
                    "body": None if body is None else base64.b64encode(body).decode(),
                    "headers": headers,
                }
                for method, route, body, headers in asks
            ]
        ),
        env=box.env_for(user),
        capture_output=True,
        text=True,
        timeout=GENEROUS,
        **user.popen_arguments(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def ask_body(**fields: Any) -> bytes:
    return json.dumps({"gpu_memory": "4G", **fields}).encode()


# ---- 1. a released kernel id stays its owner's ------------------------------------------------


def test_another_user_cannot_take_a_released_kernel_id(box: TeamBox) -> None:
    ann_server = server_of(box, ANN)
    kernel_id = started(ann_server, "4G")
    assert "Released 4G" in run(ann_server, kernel_id, "%gpu release")
    left = Ledger(box.ledger).released(kernel_id)
    assert left is not None and left.owner == ANN

    # Ben read the id off `ps` and asks the broker for a slice under it.
    [(status, answer)] = raw_calls(
        box, box.users[BEN], [("POST", "slices", ask_body(kernel_id=kernel_id), {})]
    )
    assert status == 404 and f"no GPU kernel {kernel_id} of {BEN}'s" in answer["message"], answer
    assert Ledger(box.ledger).get(kernel_id) is None
    # Ann's kernel takes its slice again under its own id.
    seen = run(ann_server, kernel_id, "%gpu request 4G")
    assert "GPU slice: 4G" in seen, seen
    record = Ledger(box.ledger).get(kernel_id)
    assert record is not None and record.owner == ANN


# ---- 2. a kernel acts on its own slice only ----------------------------------------------------

IN_A_KERNEL = """
import json
from jupyter_gpushare.backends import node_slices_for
from jupyter_gpushare.config import load_settings
from jupyter_gpushare.core.errors import GPUShareError
broker = node_slices_for(load_settings(from_files=False, reconcile=False))
answers = {{}}
for name, call in (
    ("resize a sibling", lambda: broker.resize({sibling!r}, "1G")),
    ("free a sibling", lambda: broker.free({sibling!r})),
    ("release a sibling", lambda: broker.give_back({sibling!r})),
    ("take a released sibling's id", lambda: broker.client.call(
        "POST", "slices", {{"kernel_id": {released!r}, "gpu_memory": "4G"}})),
    ("resize itself", lambda: broker.resize({itself!r}, "3G")),
):
    try:
        call()
        answers[name] = "done"
    except GPUShareError as error:
        answers[name] = [error.status, str(error)]
print("ANSWERS", json.dumps(answers))
"""


def test_a_kernel_acts_on_its_own_slice_and_no_siblings(box: TeamBox) -> None:
    server = server_of(box, ANN)
    one, two, three = (started(server, "4G") for _ in range(3))
    assert "Released 4G" in run(server, three, "%gpu release")

    code = IN_A_KERNEL.format(sibling=two, released=three, itself=one)
    seen = run(server, one, code)
    answers = json.loads(seen.split("ANSWERS", 1)[1])
    for name in ("resize a sibling", "free a sibling", "release a sibling", "take a released sibling's id"):
        status, message = answers[name]
        assert status == 403 and "a kernel acts on its own GPU slice only" in message, (name, answers)
    assert answers["resize itself"] == "done", answers
    sibling = Ledger(box.ledger).get(two)
    assert sibling is not None and sibling.state == "running" and sibling.memory == 4 * GiB
    assert Ledger(box.ledger).get(three) is None and Ledger(box.ledger).released(three) is not None

    # A process the kernel starts is the kernel's too.
    child = run(
        server,
        one,
        "import subprocess, sys\n"
        f"print(subprocess.run([sys.executable, '-c', {code!r}], capture_output=True, text=True).stdout)",
    )
    answers = json.loads(child.split("ANSWERS", 1)[1])
    assert answers["resize a sibling"][0] == 403 and answers["resize itself"] == "done", answers

    # The user's server (and the user's own command line) act on any of the user's kernels.
    resized = server.request("PATCH", f"{API}/kernels/{two}", {"gpu_memory": "2G"})
    assert resized.status == 200 and resized.body["memory_request"] == 2 * GiB, resized
    shut_down_everything(box)


def test_a_kernel_releasing_its_own_slice_keeps_what_it_holds_reserved(box: TeamBox) -> None:
    """``%gpu release`` in a kernel whose slice the broker holds: the broker measures what the
    kernel's processes still hold (on this simulated card, what the kernel declared) and keeps it
    reserved, as the node ledger does in a kernel's own process."""
    server = server_of(box, ANN)
    kernel_id = started(server, "4G")
    run(server, kernel_id, "from jupyter_gpushare import kernel as gpu\ngpu.simulate_usage('3G')")
    seen = run(server, kernel_id, "%gpu release")
    assert "Released the 4G slice, but this kernel still holds 3G on GPU0" in seen, seen
    left = Ledger(box.ledger).released(kernel_id)
    assert Ledger(box.ledger).get(kernel_id) is None and left is not None and left.held == 3 * GiB, left
    shut_down_everything(box)


# ---- 3. hostile bodies and headers get an answer, and nothing is stored -------------------------


def test_a_refusal_waits_for_the_body_a_slow_client_is_still_sending(box: TeamBox) -> None:
    """A request refused from its line alone (a kernel id that is no UUID) is answered once its
    body is in: a client that sends the body after its headers gets the answer, not a closed
    socket (CI once met EPIPE there)."""
    from jupyter_gpushare.backends.broker_client.transport import BrokerAddress

    body = b'{"restart": true}'
    head = (
        f"PATCH {BrokerAddress(box.broker_url).path('slices/none-such')} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(60)
        client.connect(str(box.socket))
        client.sendall(head.encode())
        # A slow client: the body comes once the broker has had ample time to answer the line.
        ready, _, _ = select.select([client], [], [], 1.0)
        assert not ready, client.recv(4096)  # nothing answered before the body
        client.sendall(body)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 400"), answer
    assert b"must be a kernel id" in rest, answer


ESCAPES = "esc\x1b]0;owned\x07\x1b[2J"


def test_hostile_bodies_and_headers_get_a_4xx_and_store_nothing(box: TeamBox) -> None:
    ben = box.users[BEN]
    deep_arrays = b'{"kernel_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    deep_objects = b'{"kernels": ' + b'{"a": ' * 3_000 + b"1" + b"}" * 3_000 + b"}"
    asks: list[tuple[str, str, bytes | None, dict[str, str]]] = []
    for route in ("slices", "check", "server-kernels"):
        asks += [("POST", route, deep_arrays, {}), ("POST", route, deep_objects, {})]
    fresh = str(uuid.uuid4())
    asks += [
        ("POST", "slices", b'{"kernel_id": "\\ud800", "gpu_memory": "4G"}', {}),
        ("POST", "slices", ask_body(kernel_id="nul\x00id"), {}),
        ("POST", "slices", ask_body(kernel_id=ESCAPES), {}),
        ("POST", "check", ask_body(kernel_id=ESCAPES), {}),
        ("POST", "slices", ask_body(kernel_id=fresh, kernel_name=ESCAPES), {}),
        ("POST", "slices", ask_body(kernel_id=fresh, path="a\x00b"), {}),
        ("POST", f"slices/{urllib.parse.quote(ESCAPES)}/place", b"{}", {}),
        ("PUT", f"slices/{urllib.parse.quote(ESCAPES)}/kernel", b'{"pid": null}', {}),
    ]
    answers = raw_calls(box, ben, asks)
    for (method, route, body, _), (status, answer) in zip(asks, answers, strict=True):
        shown = (method, route, (body or b"")[:60])
        assert status is not None and 400 <= status < 500, (shown, status, answer)
        assert isinstance(answer, dict) and answer.get("message"), (shown, answer)

    # Too large: an answer that says so, not a dropped connection.
    [(body_status, body_answer), (header_status, header_answer)] = raw_calls(
        box,
        ben,
        [
            ("POST", "slices", ask_body(kernel_id=fresh, path="p" * 2_000_000), {}),
            ("GET", "info", None, {"X-Filler": "x" * 200_000}),
        ],
    )
    assert body_status == 413 and "bytes" in body_answer["message"], (body_status, body_answer)
    assert header_status == 431 and "header" in header_answer["message"], (header_status, header_answer)

    # Nothing of it was stored, and root's table shows no escape sequence.
    assert not [record for record in Ledger(box.ledger).records() if record.owner == BEN]
    table = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "status"],
        env={**os.environ, "JUPYTER_GPUSHARE_BROKER_URL": box.broker_url},
        capture_output=True,
        text=True,
        timeout=GENEROUS,
        check=True,
    ).stdout
    assert "\x1b" not in table and "\x00" not in table, table
    assert "Traceback" not in box.broker_log()


# ---- 6. sizes as the OpenAPI document says ----------------------------------------------------


def test_sizes_follow_the_pattern_and_an_exclusive_card_must_be_large_enough(box: TeamBox) -> None:
    server = server_of(box, ANN)
    for cores in ("٥٠", "５٠", "50%%", "+50", "5 0", "\u00a050"):
        answer = start(server, "4G", gpu_cores=cores)
        assert answer.status == 400 and "gpu_cores" in answer.body["message"], (cores, answer)
        [(status, refusal)] = raw_calls(
            box, box.users[BEN], [("POST", "check", ask_body(gpu_cores=cores), {})]
        )
        assert status == 400 and "gpu_cores" in refusal["message"], (cores, status, refusal)
    assert start(server, "4G", gpu_cores="50%").status == 201

    fit = server.request("GET", f"{API}/fit?gpu_memory=90G&gpu_mode=exclusive")
    assert fit.status == 200 and fit.body[0]["verdict"] == "never", fit.body
    assert "90G is larger than any GPU in the pool (largest: 80G on GPU0)" in fit.body[0]["reason"], fit.body
    refused = start(server, "90G", gpu_mode="exclusive")
    assert refused.status == 409 and fit.body[0]["reason"] in refused.body["message"], refused
    shut_down_everything(box)
    fits = server.request("GET", f"{API}/fit?gpu_memory=8G&gpu_mode=exclusive")
    assert fits.body[0]["verdict"] == "now", fits.body
    placed = start(server, "8G", gpu_mode="exclusive")
    assert placed.status == 201 and placed.body["memory_request"] == 80 * GiB, placed
    shut_down_everything(box)


# ---- 5. no ghost in the queue -----------------------------------------------------------------

ASKS_AND_STOPS_WAITING = """
import json, sys
from jupyter_gpushare.backends.broker_client.transport import BrokerClient
answer = BrokerClient({url!r}).call("POST", "slices", {{"kernel_id": {kernel_id!r}, "gpu_memory": "30G"}})
print(json.dumps(answer), flush=True)
sys.stdin.read()  # alive, and never asks again
"""


def view(server: JupyterServer, kernel_id: str) -> dict[str, Any]:
    return dict(server.request("GET", f"{API}/kernels/{kernel_id}").body)


def test_a_restarted_broker_keeps_waiting_starts_and_drops_requests_nobody_waits_for(box: TeamBox) -> None:
    ann_server, ben_server = server_of(box, ANN), server_of(box, BEN)
    shut_down_everything(box)
    big = started(ann_server, "60G")
    waiting = start(ben_server, "30G")
    assert waiting.status == 202 and waiting.body["state"] == "queued", waiting
    ghost_id = str(uuid.uuid4())
    ben = box.users[BEN]
    ghost = subprocess.Popen(
        [str(box.python), "-c", ASKS_AND_STOPS_WAITING.format(url=box.broker_url, kernel_id=ghost_id)],
        env=box.env_for(ben),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **ben.popen_arguments(),
    )
    try:
        assert ghost.stdout is not None
        assert json.loads(ghost.stdout.readline())["state"] == "waiting"
        box.kill_broker()
        box.start_broker()
        # The card empties: Ben's start, which waited through the restart, is placed.
        ann_server.request("DELETE", f"/api/kernels/{big}")
        placed = wait_until(
            lambda: view(ben_server, waiting.body["kernel_id"]),
            GENEROUS,
            message="Ben's waiting start placed after the broker's restart",
            until=lambda seen: seen.get("state") == "running",
        )
        assert placed["memory_request"] == 30 * GiB
        # Nobody waits for the request of Ben's script any more: it goes, and Ann's start behind
        # it is placed on the 50G left.
        behind = start(ann_server, "30G")
        assert behind.status in (201, 202), behind
        wait_until(
            lambda: view(ann_server, behind.body["kernel_id"]),
            GENEROUS,
            message="Ann's start placed once the abandoned request went",
            until=lambda seen: seen.get("state") == "running",
        )
        assert Ledger(box.ledger).get(ghost_id) is None
        assert f"nobody asked after it for {WAITING_LEASE}" in box.broker_log()
    finally:
        ghost.kill()
        ghost.wait()
    shut_down_everything(box)


# ---- 7. a read-only ledger: one verdict, everywhere -------------------------------------------


def chattr_works(path: Path) -> bool:
    """Whether this filesystem honours ``chattr +i`` (ext4 and xfs do; tmpfs and overlay may not)."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        return False
    subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=True)
    return True


@contextlib.contextmanager
def made_read_only(ledger: Path, how: str) -> Iterator[None]:
    if how == "chmod":
        mode = ledger.stat().st_mode & 0o777
        ledger.chmod(0o444)
        try:
            yield
        finally:
            ledger.chmod(mode)
    else:
        subprocess.run(["chattr", "+i", str(ledger)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(ledger)], check=True)


def test_a_read_only_ledger_is_one_verdict_with_its_fix_everywhere(box: TeamBox) -> None:
    ann = box.users[ANN]
    ledger = ann.home / "own-ledger" / "ledger.sqlite"
    own = {
        "JUPYTER_GPUSHARE_BROKER_URL": "",  # Ann's own server, with the ledger in her home
        "JUPYTER_GPUSHARE_LEDGER_PATH": str(ledger),
        "JUPYTER_GPUSHARE_SIMULATE": "1xA100-80GB",
    }
    server = wait_ready(box.server(ann, "own", **own))
    kernel_id = started(server, "4G")
    ways = ["chmod"] + (["chattr"] if chattr_works(ledger) else [])
    for how in ways:
        with made_read_only(ledger, how):
            pool = server.request("GET", f"{API}/pool")
            problem = pool.body.get("problem") or ""
            assert pool.status == 200 and f"The GPU ledger {ledger} is read-only" in problem, (how, pool)
            assert "chattr -i" in problem and "chmod" in problem
            refused = start(server, "4G")
            assert refused.status == 503 and refused.body["message"] == problem, (how, refused)
            resized = server.request("PATCH", f"{API}/kernels/{kernel_id}", {"gpu_memory": "2G"})
            assert resized.status == 503 and resized.body["message"] == problem, (how, resized)
            assert f"Warning: {problem}" in run(server, kernel_id, "%gpu pool"), how
            assert f"%gpu resize: {problem}" in run(server, kernel_id, "%gpu resize 3G"), how
            status = subprocess.run(
                [str(box.python), "-m", "jupyter_gpushare.cli", "status"],
                env=box.env_for(ann, **own),
                capture_output=True,
                text=True,
                timeout=GENEROUS,
                **ann.popen_arguments(),
            )
            assert status.returncode == 1 and problem in status.stderr, (how, status.stderr)
            # Nothing was placed, in the file or its write-ahead log (read as sqlite reads it).
            with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
                rows = db.execute("SELECT kernel_id, memory FROM slices").fetchall()
            assert rows == [(kernel_id, 4 * GiB)], (how, rows)
        wait_until(
            lambda: server.request("GET", f"{API}/pool").body,
            GENEROUS,
            message="the pool without a problem once the ledger is writable again",
            until=lambda pool: not pool.get("problem"),
        )
    last = start(server, "4G")
    assert last.status == 201, last.body["message"][-400:]
    server.stop()
