"""The REST API against a real ``jupyter server`` process (docs/reference/rest-api.md,
docs/how-it-works/ledger.md)."""

from __future__ import annotations

import gzip
import hashlib
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS, GiB
from jupyter_gpushare.server.content_coding import GZIP_MIN_BYTES

from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
ROUTES = [
    ("GET", f"{API}/pool"),
    ("GET", f"{API}/kernels"),
    ("POST", f"{API}/kernels"),
    ("GET", f"{API}/kernels/some-id"),
    ("PATCH", f"{API}/kernels/some-id"),
    ("DELETE", f"{API}/kernels/some-id/gpu"),
    ("POST", f"{API}/kernels/some-id/suspend"),
    ("POST", f"{API}/kernels/some-id/resume"),
    ("GET", f"{API}/stream"),
    ("GET", f"{API}/fit?gpu_memory=4G"),
    ("GET", f"{API}/openapi.yaml"),
]


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


def metrics(server: JupyterServer) -> str:
    request = urllib.request.Request(
        f"{server.url}/metrics", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return str(reply.read().decode())


def etag(server: JupyterServer, path: str) -> str:
    """The ETag of a GET, checked to be the SHA-1 of the body (what tornado computes)."""
    request = urllib.request.Request(
        f"{server.url}{path}", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        tag, body = reply.headers["Etag"], reply.read()
    assert tag == f'"{hashlib.sha1(body).hexdigest()}"'
    return str(tag)


def test_every_route_refuses_without_credentials(server: JupyterServer) -> None:
    # One server for all routes: starting one per case would cost seconds each.
    for token in (None, "wrong-token"):
        for method, path in ROUTES:
            body = {"gpu_memory": "4G"} if method in ("POST", "PATCH") else None
            answer = server.request(method, path, body, token=token)
            assert answer.status in (401, 403), (method, path, token, answer)


def test_start_read_resize_release_shutdown(node: Node, server: JupyterServer) -> None:
    pool = server.request("GET", f"{API}/pool")
    assert pool.status == 200 and pool.body["simulated"] is True
    assert [device["memory_total"] for device in pool.body["devices"]] == [80 * GiB]

    started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "path": "work/a.ipynb"})
    assert started.status == 201, started
    kernel_id = started.body["kernel_id"]
    assert started.body["state"] == "running" and started.body["memory_request"] == 4 * GiB
    assert started.body["path"] == "work/a.ipynb" and started.body["kernel_name"] == "python3-gpu-4g"
    # An ordinary kernel everywhere else.
    assert kernel_id in {kernel["id"] for kernel in server.request("GET", "/api/kernels").body}

    read = server.request("GET", f"{API}/kernels/{kernel_id}")
    assert read.status == 200 and read.body["device"] == 0

    before = etag(server, f"{API}/kernels")
    resized = server.request("PATCH", f"{API}/kernels/{kernel_id}", {"gpu_memory": "12G"})
    assert resized.status == 200 and resized.body["memory_request"] == 12 * GiB
    # GET pool and GET kernels are rendered once per change, ETag included: a client's cached
    # copy is answered 304 until the next change.
    after = etag(server, f"{API}/kernels")
    assert after != before
    assert server.request("GET", f"{API}/kernels", headers={"If-None-Match": before}).status == 200
    assert server.request("GET", f"{API}/kernels", headers={"If-None-Match": after}).status == 304
    pool_tag = etag(server, f"{API}/pool")
    assert server.request("GET", f"{API}/pool", headers={"If-None-Match": pool_tag}).status == 304
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 12 * GiB

    series = metrics(server)
    assert 'jupyter_gpushare_device_memory_reserved_bytes{device="GPU0"' in series
    assert f'jupyter_gpushare_kernel_memory_request_bytes{{device="GPU0",kernel_id="{kernel_id}"' in series
    assert "jupyter_gpushare_queue_length 0.0" in series

    released = server.request("DELETE", f"{API}/kernels/{kernel_id}/gpu")
    assert released.status == 204
    assert node.ledger.get(kernel_id) is None
    after = server.request("GET", f"{API}/kernels/{kernel_id}")
    assert after.status == 200 and after.body["state"] == "released"
    assert kernel_id in {kernel["id"] for kernel in server.request("GET", "/api/kernels").body}
    assert server.request("DELETE", f"{API}/kernels/{kernel_id}/gpu").status == 409

    assert server.request("DELETE", f"/api/kernels/{kernel_id}").status == 204
    assert server.request("GET", f"{API}/kernels").body == []


def test_a_start_that_must_wait_answers_queued_then_runs(node: Node, server: JupyterServer) -> None:
    first = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g"})
    second = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g"})
    started = time.monotonic()
    third = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g"})
    assert time.monotonic() - started < 5, "a queued start must answer quickly"
    assert (first.status, second.status, third.status) == (201, 201, 202)
    assert third.body["state"] == "queued" and third.body["queue_position"] == 1
    queued_id = third.body["kernel_id"]
    assert "jupyter_gpushare_queue_length 1.0" in metrics(server)

    assert server.request("DELETE", f"/api/kernels/{first.body['kernel_id']}").status == 204
    wait_until(lambda: server.request("GET", f"{API}/kernels/{queued_id}").body.get("state") == "running")
    wait_until(lambda: queued_id in {k["id"] for k in server.request("GET", "/api/kernels").body})
    assert node.reserved() == 60 * GiB


def test_a_start_with_an_override_size(node: Node, server: JupyterServer) -> None:
    started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": "6G"})
    assert started.status == 201 and started.body["memory_request"] == 6 * GiB
    numeric = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "gpu_memory": 2048})
    assert numeric.status == 201 and numeric.body["memory_request"] == 2 * GiB


BAD_STARTS = [
    ({"name": "python3-gpu-4g", "gpu_memory": "abc"}, 400, ACCEPTED_FORMS),
    ({"name": "python3-gpu-4g", "gpu_memory": "-3G"}, 400, "must be more than zero"),
    ({"name": "python3-gpu-4g", "gpu_memory": "0"}, 400, "must be more than zero"),
    ({"name": "python3-gpu-4g", "gpu_memory": 0}, 400, "must be more than zero"),
    ({"name": "python3-gpu-4g", "gpu_memory": -5}, 400, "must be more than zero"),
    ({"name": "python3-gpu-4g", "gpu_memory": "1000G"}, 409, "larger than any GPU"),
    ({"name": "python3-gpu-4g", "gpu_memory": 1.5}, 400, "gpu_memory must be a string or a whole number"),
    ({"name": "python3-gpu-4g", "gpu_memory": [4]}, 400, "gpu_memory must be"),
    ({"name": "python3-gpu-4g", "gpu_memory": True}, 400, "gpu_memory must be"),
    ({"name": "python3-gpu-4g", "gpu_mode": "quantum"}, 400, "unknown GPU mode 'quantum'"),
    ({"name": "python3-gpu-4g", "gpu_mode": "mig"}, 409, "needs MIG instances"),
    ({"name": "python3-gpu-4g", "gpu_cores": 0}, 400, "gpu_cores must be from 1 to 100"),
    ({"name": "python3-gpu-4g", "gpu_cores": "lots"}, 400, "gpu_cores must be"),
    ({"name": "no-such-spec"}, 400, "no kernelspec named 'no-such-spec'"),
    ({"name": "python3"}, 400, "does not use gpushare-provisioner"),
    ({"name": 5}, 400, "name must be a string"),
    ({"path": ["x"]}, 400, "path must be a string"),
]


def test_bad_starts_are_4xx_with_a_message_and_change_nothing(node: Node, server: JupyterServer) -> None:
    for body, status, message in BAD_STARTS:
        answer = server.request("POST", f"{API}/kernels", body)
        assert answer.status == status, (body, answer)
        assert message in answer.body["message"], (body, answer)
    for raw in (b"not json", b"[1, 2]", b'"4G"', b"\xff\xfe"):
        answer = server.request("POST", f"{API}/kernels", raw=raw)
        assert answer.status == 400 and "JSON" in answer.body["message"], (raw, answer)
    assert node.ledger.records() == []
    assert server.request("GET", "/api/kernels").body == []


def test_bad_resizes_and_unknown_kernels(node: Node, server: JupyterServer) -> None:
    kernel_id = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-16g"}).body["kernel_id"]
    other = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g"}).body["kernel_id"]
    for body, status, message in [
        ({"gpu_memory": "abc"}, 400, ACCEPTED_FORMS),
        ({"gpu_memory": "-3G"}, 400, "more than zero"),
        ({"gpu_memory": None}, 400, "gpu_memory must be a size"),
        ({"gpu_memory": {"size": 4}}, 400, "gpu_memory must be"),
        ({}, 400, 'send {"gpu_memory": SIZE}'),
        ({"gpu_memory": "8G", "gpu_mode": "mps"}, 400, "only gpu_memory can be changed"),
        ({"gpu_memory": "60G"}, 409, "60G does not fit: 34G free on GPU0, so this kernel can grow to 50G"),
        ({"gpu_memory": "1000G"}, 409, "larger than any GPU"),
    ]:
        answer = server.request("PATCH", f"{API}/kernels/{kernel_id}", body)
        assert (answer.status, message in answer.body["message"]) == (status, True), (body, answer)
    assert server.request("PATCH", f"{API}/kernels/{kernel_id}", raw=b"{").status == 400
    record = node.ledger.get(kernel_id)
    assert record is not None and record.memory == 16 * GiB
    assert node.reserved() == 46 * GiB

    for method, path, body in [
        ("GET", f"{API}/kernels/nope", None),
        ("PATCH", f"{API}/kernels/nope", {"gpu_memory": "4G"}),
        ("DELETE", f"{API}/kernels/nope/gpu", None),
    ]:
        answer = server.request(method, path, body)
        assert answer.status == 404 and "nope" in answer.body["message"], (method, answer)
    assert {record.kernel_id for record in node.running()} == {kernel_id, other}


def test_two_servers_see_their_own_kernels_and_the_others_as_occupancy(node: Node) -> None:
    alice = start_server(node, "alice", {"JUPYTER_GPUSHARE_OWNER": "alice"})
    bob = start_server(node, "bob", {"JUPYTER_GPUSHARE_OWNER": "bob"})
    try:
        mine = alice.request("POST", f"{API}/kernels", {"name": "python3-gpu-16g", "path": "alice.ipynb"})
        theirs = bob.request("POST", f"{API}/kernels", {"name": "python3-gpu-30g", "path": "bob.ipynb"})
        assert (mine.status, theirs.status) == (201, 201)
        alice_id, bob_id = mine.body["kernel_id"], theirs.body["kernel_id"]

        alice_kernels = alice.request("GET", f"{API}/kernels").body
        assert [kernel["kernel_id"] for kernel in alice_kernels] == [alice_id]
        assert alice_kernels[0]["owner"] == "alice"
        pool = alice.request("GET", f"{API}/pool").body
        assert pool["devices"][0]["memory_reserved"] == 46 * GiB  # bob's 30G counted, not named
        assert "bob.ipynb" not in str(pool) and bob_id not in str(pool)
        assert bob_id not in str(alice.request("GET", f"{API}/kernels").body)

        for method, path, body in [
            ("GET", f"{API}/kernels/{bob_id}", None),
            ("PATCH", f"{API}/kernels/{bob_id}", {"gpu_memory": "2G"}),
            ("DELETE", f"{API}/kernels/{bob_id}/gpu", None),
        ]:
            assert alice.request(method, path, body).status == 404
        record = node.ledger.get(bob_id)
        assert record is not None and record.memory == 30 * GiB and record.owner == "bob"
        assert [kernel["kernel_id"] for kernel in bob.request("GET", f"{API}/kernels").body] == [bob_id]
    finally:
        alice.stop()
        bob.stop()


def test_the_stream_sends_a_snapshot_per_sample(node: Node) -> None:
    node.write_server_config({"sample_interval": 0.2})
    server = start_server(node, "streaming")
    try:
        kernel_id = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g"}).body["kernel_id"]
        request = urllib.request.Request(
            f"{server.url}{API}/stream", headers={"Authorization": f"token {server.token}"}
        )
        events: list[tuple[int, str]] = []
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.headers["Content-Type"].startswith("text/event-stream")
            event_id = None
            for raw in reply:
                line = raw.decode().rstrip("\n")
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: "):
                    assert event_id is not None
                    events.append((event_id, line[6:]))
                    if len(events) == 5:
                        break
        elapsed = time.monotonic() - started
        import json

        payloads = [json.loads(data) for _, data in events]
        assert [event_id for event_id, _ in events] == sorted({event_id for event_id, _ in events})
        assert all(set(payload) == {"pool", "kernels"} for payload in payloads)
        assert payloads[-1]["kernels"][0]["kernel_id"] == kernel_id
        assert elapsed < 1.5 * 5, "about one event per sample_interval"
    finally:
        server.stop()


def raw_get(server: JupyterServer, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """A GET as it comes off the socket (urllib leaves a gzip body compressed)."""
    request = urllib.request.Request(
        f"{server.url}{path}", headers={"Authorization": f"token {server.token}", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_a_large_list_goes_gzip_compressed_to_a_client_that_accepts_it(
    node: Node, server: JupyterServer
) -> None:
    started = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", "path": "a.ipynb"})
    assert started.status == 201, started
    mine = node.ledger.get(started.body["kernel_id"])
    assert mine is not None
    ledger, policy = node.ledger, Policy()
    for index in range(20):  # this server's slices, as many kernels would leave them
        request = NewRequest(
            kernel_id=f"listed-{index:02d}",
            owner=mine.owner,
            server_id=mine.server_id,
            mode=mine.mode,
            placement=mine.placement,
            size="512M",
            cores=None,
            holder=mine.process,
            kernel_name="python3-gpu-4g",
            path=f"projects/run-{index:02d}/analysis.ipynb",
        )
        assert isinstance(ledger.request(request, policy), Placed)

    def listed() -> tuple[int, dict[str, str], bytes] | None:
        answer = raw_get(server, f"{API}/kernels", {})
        return answer if answer[2].count(b'"kernel_id"') >= 21 else None

    status, plain_headers, plain = wait_until(listed, timeout=60, message="20 more kernels listed")
    assert status == 200 and "Content-Encoding" not in plain_headers
    assert len(plain) >= GZIP_MIN_BYTES and plain_headers["Vary"] == "Accept-Encoding"

    status, headers, body = raw_get(server, f"{API}/kernels", {"Accept-Encoding": "br, gzip;q=0.8"})
    assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    assert gzip.decompress(body) == plain and len(body) < len(plain) // 4
    # Its own ETag, for its own bytes; a client's cached copy of either coding is answered 304.
    assert headers["Etag"] == f'"{hashlib.sha1(body).hexdigest()}"' != plain_headers["Etag"]
    for accepted, tag in (("gzip", headers["Etag"]), ("identity", plain_headers["Etag"])):
        cached = {"Accept-Encoding": accepted, "If-None-Match": tag}
        assert raw_get(server, f"{API}/kernels", cached)[0] == 304
    # A client that refuses gzip, or weighs it at zero, gets the plain bytes.
    for refusal in ("identity", "gzip;q=0, identity", "*;q=0"):
        status, headers, body = raw_get(server, f"{API}/kernels", {"Accept-Encoding": refusal})
        assert status == 200 and "Content-Encoding" not in headers and body == plain, refusal
    # The pool's small body is never compressed.
    status, headers, _ = raw_get(server, f"{API}/pool", {"Accept-Encoding": "gzip"})
    assert status == 200 and "Content-Encoding" not in headers
