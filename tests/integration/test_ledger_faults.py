"""Faults and hostile input against real ``jupyter server`` processes and real ledger files (issue 11).

Each fault is done for real — the ledger deleted, overwritten with garbage, truncated, made
read-only, held locked — while servers and kernels use it. After each one: every user-facing
path (``jupyter gpushare status``, REST, the panel's pool) answers with one sentence naming the
file and the fix, never a 500 or a traceback; no device's reservations exceed its capacity and
no card is held twice; and once the fault is removed everything works without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config.kernelspecs import install_kernelspecs
from jupyter_gpushare.core.sizes import GiB

from ..support.kernels import STARTER
from ..support.nodes import BIN, Node, make_node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, start_server

pytestmark = pytest.mark.integration

API = "/api/gpushare"
POOL = "2xA100-80GB,1xT4-16GB"
FAST = {"JUPYTER_GPUSHARE_SIMULATE": POOL, "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.2"}


# ---- helpers ------------------------------------------------------------------------------------


@dataclass
class Status:
    returncode: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def status(node: Node, *arguments: str, env: dict[str, str] | None = None, timeout: float = 60) -> Status:
    """``jupyter gpushare status`` as its own process, the way a user runs it."""
    done = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "status", *arguments],
        env={**node.env, **FAST, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Status(done.returncode, done.stdout, done.stderr)


def assert_one_sentence(answer: Status, path: Path) -> None:
    """Exit status 1, and on stderr one line that names the file: no traceback."""
    assert answer.returncode == 1, answer
    assert "Traceback" not in answer.err and "Traceback" not in answer.out, answer
    lines = [line for line in answer.err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0], answer


def assert_invariants(path: Path) -> None:
    """No device's reservations exceed its capacity; no card is held by two slices at once."""
    ledger = Ledger(path)
    try:
        devices, running = ledger.devices(), [r for r in ledger.records() if r.state == "running"]
    finally:
        ledger.close()
    for device in devices:
        on_device = [record for record in running if record.device_uuid == device.uuid]
        assert sum(record.memory for record in on_device) <= device.memory_total, (device, on_device)
        if any(record.whole_card for record in on_device):
            assert len(on_device) == 1, f"{device.label} is held twice: {on_device}"


def start(server: JupyterServer, **body: Any) -> dict[str, Any]:
    answer = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g", **body})
    assert answer.status == 201, answer
    return answer.body  # type: ignore[no-any-return]


def pool_problem(server: JupyterServer) -> str | None:
    answer = server.request("GET", f"{API}/pool")
    assert answer.status == 200, answer  # the panel's banner, never an error
    return answer.body.get("problem")  # type: ignore[no-any-return]


def reserved(server: JupyterServer) -> list[int]:
    return [device["memory_reserved"] for device in server.request("GET", f"{API}/pool").body["devices"]]


def gpushare_tracebacks(log: str) -> list[str]:
    """Tracebacks in a server's log that pass through our code (a kernel process killed while it
    still imports, as a server stops, prints one of its own: not ours)."""
    blocks = log.split("Traceback (most recent call last):\n")[1:]
    return [block for block in blocks if _is_the_servers_through_ours(_frames(block))]


def _is_the_servers_through_ours(frames: list[str]) -> bool:
    # A kernel runs as ``python -m ipykernel_launcher``: its tracebacks start in runpy, the
    # server's (a console script, or one of its threads) never do.
    started_by_runpy = bool(frames) and "<frozen runpy>" in frames[0]
    return not started_by_runpy and any(_OUR_FRAME in frame for frame in frames)


_OUR_FRAME = f"{os.sep}jupyter_gpushare{os.sep}"


def _frames(block: str) -> list[str]:
    """The ``File "..."`` lines of one traceback: its indented lines up to the exception line.
    Only frames count, since other processes' output (a kernel's stderr, the server's next log
    line) may follow the traceback on the same or the next lines and name our package."""
    frames = []
    for line in block.splitlines():
        if not line.startswith(" "):
            break
        if line.lstrip().startswith("File "):
            frames.append(line)
    return frames


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float) -> float:
    started = time.monotonic()
    process.wait(timeout=timeout)  # TimeoutExpired fails the test: SIGTERM did not end it
    return time.monotonic() - started


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, JupyterServer]]:
    """One server for the faults it survives without a restart: each test mends what it broke,
    and the next one starts from there (that the server goes on is part of what is tested)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        node = make_node(tmp_path_factory.mktemp("faults"), monkeypatch)
        running = start_server(node, extra_env=FAST)
        yield node, running
        running.stop()


@pytest.fixture
def node(shared: tuple[Node, JupyterServer]) -> Node:
    return shared[0]


@pytest.fixture
def server(shared: tuple[Node, JupyterServer]) -> Iterator[JupyterServer]:
    """The shared server, with every kernel a test started shut down after it."""
    running = shared[1]
    yield running
    for kernel in running.request("GET", "/api/kernels").body:
        running.request("DELETE", f"/api/kernels/{kernel['id']}")
    wait_until(
        lambda: running.request("GET", f"{API}/pool").body.get("devices") and not any(reserved(running))
    )


@pytest.fixture
def own_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, JupyterServer]]:
    """A server and node of a test's own, for faults that end the server."""
    node = make_node(tmp_path, monkeypatch)
    running = start_server(node, extra_env=FAST)
    yield node, running
    running.stop()


# ---- 1. the ledger deleted while a server runs ----------------------------------------------------


def test_a_deleted_ledger_is_put_back_and_no_card_is_handed_out_twice(
    node: Node, server: JupyterServer
) -> None:
    kernels = [start(server, gpu_memory="whole") for _ in range(3)]
    assert sorted(kernel["device"] for kernel in kernels) == [0, 1, 2]
    for leftover in glob.glob(f"{node.ledger_path}*"):
        os.unlink(leftover)

    # A new process sees the cards held: it waits for the server to put the file back and
    # never starts an empty ledger of its own.
    seen = status(node, "--json")
    assert seen.returncode == 0, seen
    devices = seen.json()["pool"]["devices"]
    assert [device["memory_reserved"] for device in devices] == [d["memory_total"] for d in devices]
    assert node.ledger_path.exists()
    assert_invariants(node.ledger_path)

    # A kernel started from a console does not get a card a server kernel holds.
    console = subprocess.run(
        [sys.executable, str(STARTER), "python3-gpu-4g"],
        env={**node.env, **FAST, "JUPYTER_GPUSHARE_WHEN_FULL": "fail"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert console.returncode != 0 and "does not fit" in console.stderr, console
    assert_invariants(node.ledger_path)

    # Without a restart the server goes on: a card given back can be taken again.
    assert server.request("DELETE", f"/api/kernels/{kernels[2]['kernel_id']}").status == 204
    assert start(server, gpu_memory="4G")["device"] == kernels[2]["device"]
    assert_invariants(node.ledger_path)


# ---- 2. a damaged, truncated, read-only or locked ledger ------------------------------------------


def test_a_damaged_ledger_is_one_sentence_everywhere_and_mends_once_moved_away(
    node: Node, server: JupyterServer
) -> None:
    held = start(server, gpu_memory="30G")
    with node.ledger_path.open("r+b") as ledger:
        ledger.write(b"garbage " * 4096)

    problem = wait_until(lambda: pool_problem(server))
    assert str(node.ledger_path) in problem and "damaged" in problem and "mv " in problem
    for method, path, body in (
        ("GET", f"{API}/kernels", None),
        ("GET", f"{API}/kernels/{held['kernel_id']}", None),
        ("POST", f"{API}/kernels", {"name": "python3-gpu-4g"}),
        ("PATCH", f"{API}/kernels/{held['kernel_id']}", {"gpu_memory": "8G"}),
        ("POST", "/api/kernels", {"name": "python3-gpu-4g"}),
    ):
        answer = server.request(method, path, body)
        assert answer.status == 503, (method, path, answer)
        assert str(node.ledger_path) in answer.body["message"], answer
    assert_one_sentence(status(node), node.ledger_path)
    out, err = run(server, held["kernel_id"], "%gpu")
    assert f"%gpu status: The GPU ledger {node.ledger_path} is damaged" in err, (out, err)
    assert "Traceback" not in err

    # The fix the sentence names; the server records its kernel's slice in a new ledger.
    node.ledger_path.rename(node.ledger_path.with_name("ledger.sqlite.broken"))
    wait_until(lambda: pool_problem(server) is None, timeout=60)
    assert reserved(server) == [30 * GiB, 0, 0]
    assert start(server, gpu_memory="60G")["device"] == 1  # GPU0 keeps the 30G it holds
    assert_invariants(node.ledger_path)
    assert not gpushare_tracebacks(server.log())


def test_a_truncated_ledger_neither_hangs_nor_hides_the_routes(
    own_server: tuple[Node, JupyterServer],
) -> None:
    node, server = own_server
    start(server, gpu_memory="16G")
    os.truncate(node.ledger_path, 0)
    started = time.monotonic()
    assert_one_sentence(status(node), node.ledger_path)
    assert time.monotonic() - started < 8, "status answered at once, not after a lock timeout"

    # SIGTERM ends a server whose ledger is broken, in its usual shutdown time.
    server.process.send_signal(signal.SIGTERM)
    wait_for_exit(server.process, timeout=20)

    # A server started on the broken ledger still has its routes and says what is wrong.
    again = start_server(node, "again", extra_env=FAST)
    try:
        assert str(node.ledger_path) in (pool_problem(again) or "")
        began = time.monotonic()
        answer = again.request("POST", "/api/kernels", {"name": "python3-gpu-4g"})
        assert answer.status == 503 and str(node.ledger_path) in answer.body["message"], answer
        assert time.monotonic() - began < 8
        node.ledger_path.unlink()  # the fix: the server starts a ledger of its own
        wait_until(lambda: pool_problem(again) is None, timeout=60)
        start(again, gpu_memory="16G")
        assert_invariants(node.ledger_path)
    finally:
        again.stop()
    assert not gpushare_tracebacks(again.log())


def test_a_held_lock_is_waited_for_a_bounded_time_and_its_holder_named(
    node: Node, server: JupyterServer
) -> None:
    start(server, gpu_memory="4G")
    quick = {"JUPYTER_GPUSHARE_LEDGER_LOCK_TIMEOUT": "1"}
    with open(f"{node.ledger_path}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        began = time.monotonic()
        answer = status(node, env=quick)
        assert time.monotonic() - began < 8
        assert_one_sentence(answer, node.ledger_path)
        assert f"process {os.getpid()}" in answer.err and "locked" in answer.err
    assert status(node, env=quick).returncode == 0  # the lock is free again
    assert_invariants(node.ledger_path)


class ReadOnly:
    """Making the ledger read-only for the server, for real, whoever runs the tests.

    Root may write anything, so as root the server runs as an unprivileged user the test creates
    (``useradd``, removed afterwards) on a ledger only root may write; where that user cannot
    run this Python (it lives in root's home), the ledger file is made immutable (``chattr +i``)
    instead. Anyone else: plain permissions.
    """

    def __init__(self, root: Path, account: tuple[int, int] | None, immutable: bool) -> None:
        self.root, self.account, self.immutable = root, account, immutable
        self.node = _shared_node(root, account)

    def make_read_only(self) -> None:
        if self.immutable:
            subprocess.run(["chattr", "+i", str(self.node.ledger_path)], check=True)
        else:
            os.chmod(self.node.ledger_path.parent, 0o555)
            os.chmod(self.node.ledger_path, 0o444)

    def make_writable(self) -> None:
        if self.immutable:
            subprocess.run(["chattr", "-i", str(self.node.ledger_path)], check=True)
            return
        os.chmod(self.node.ledger_path.parent, 0o777)
        for path in glob.glob(f"{self.node.ledger_path}*"):
            os.chmod(path, 0o666)


def _runs_as(uid: int, gid: int) -> bool:
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import jupyter_gpushare"],
            user=uid,
            group=gid,
            extra_groups=[],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except PermissionError:
        return False
    return probe.returncode == 0


def _can_make_immutable(directory: Path) -> bool:
    probe = directory / "chattr-probe"
    probe.touch()
    try:
        made = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False)
        return made.returncode == 0
    except FileNotFoundError:
        return False
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
        probe.unlink()


@pytest.fixture
def read_only() -> Iterator[ReadOnly]:
    # A world-readable tree (pytest's own is private to root): another user may run a server in it.
    root = Path(tempfile.mkdtemp(prefix="gpushare-ro-", dir="/tmp"))
    os.chmod(root, 0o755)
    user = None
    try:
        if os.geteuid() != 0:
            yield ReadOnly(root, None, immutable=False)
            return
        user = f"gpushare{uuid.uuid4().hex[:8]}"
        subprocess.run(
            [shutil.which("useradd") or "/usr/sbin/useradd", "--system", "--no-create-home", user],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(user)
        if _runs_as(entry.pw_uid, entry.pw_gid):
            yield ReadOnly(root, (entry.pw_uid, entry.pw_gid), immutable=False)
        elif _can_make_immutable(root):
            yield ReadOnly(root, None, immutable=True)
        else:
            pytest.fail(
                "cannot make a ledger read-only for a server: as root, the unprivileged user "
                f"cannot run {sys.executable} and this filesystem has no chattr +i"
            )
    finally:
        if user is not None:
            subprocess.run(
                [shutil.which("userdel") or "/usr/sbin/userdel", user], capture_output=True, check=False
            )
        for path in glob.glob(f"{root}/ledger/*"):
            subprocess.run(["chattr", "-i", path], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            os.chmod(root / "ledger", 0o755)
        shutil.rmtree(root, ignore_errors=True)


def test_a_read_only_ledger_is_one_sentence_and_works_once_writable(read_only: ReadOnly) -> None:
    node = read_only.node
    made = status(node)  # the ledger exists, made by this user
    assert made.returncode == 0, made
    read_only.make_read_only()
    server = start_server(node, "readonly", as_user=read_only.account)
    try:
        problem = wait_until(lambda: pool_problem(server))
        assert "read-only" in problem and str(node.ledger_path) in problem, problem
        answer = server.request("POST", f"{API}/kernels", {"name": "python3-gpu-4g"})
        assert answer.status == 503 and "read-only" in answer.body["message"], answer
        assert not gpushare_tracebacks(server.log())

        read_only.make_writable()  # the fix, without a restart
        wait_until(lambda: pool_problem(server) is None, timeout=60)
        start(server, gpu_memory="4G")
        assert_invariants(node.ledger_path)
    finally:
        server.stop()


def _shared_node(root: Path, account: tuple[int, int] | None) -> Node:
    paths = {name: root / name.lower() for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR")}
    paths["JUPYTER_RUNTIME_DIR"] = root / "runtime"
    paths["HOME"] = root / "home"
    for path in paths.values():
        path.mkdir()
        if account is not None:
            os.chown(path, *account)
    (root / "ledger").mkdir()
    install_kernelspecs(["4G"], prefix=str(root / "prefix"))
    env = dict(os.environ) | {name: str(path) for name, path in paths.items()}
    env |= {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "JUPYTER_PATH": str(root / "prefix" / "share" / "jupyter"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_GPUSHARE_LEDGER_PATH": str(root / "ledger" / "ledger.sqlite"),
        **FAST,
    }
    return Node(root, root / "ledger" / "ledger.sqlite", env, 80 * GiB)


# ---- 3. a kernel that lies about its id -----------------------------------------------------------


def run(server: JupyterServer, kernel_id: str, code: str) -> tuple[str, str]:
    return asyncio.run(execute(server, kernel_id, code))


def test_a_kernel_cannot_take_a_slice_under_another_kernels_id(node: Node, server: JupyterServer) -> None:
    x = start(server, path="work/x.ipynb")["kernel_id"]
    z = start(server, path="work/z.ipynb")["kernel_id"]
    out, err = run(server, x, "%gpu release")
    assert "Released 4G" in out, (out, err)

    # Z claims X's id and drops its own token, and makes the magics build a new slice handle
    # from that environment: refused, and nothing is recorded under X.
    pretend = (
        "import os\n"
        "from jupyter_gpushare.kernel import slice_handle\n"
        "slice_handle._chosen = None\n"
        "os.environ.pop('JUPYTER_GPUSHARE_TOKEN', None)\n"
        "os.environ['JUPYTER_GPUSHARE_KERNEL_ID'] = {!r}\n"
        "get_ipython().run_line_magic('gpu', 'request 3G')\n"
    )
    out, err = run(server, z, pretend.format(x))
    assert "belongs to another kernel" in err, (out, err)
    assert server.request("GET", f"{API}/kernels/{x}").body["state"] == "released"
    # Nor under an id no kernel of its own was started with.
    out, err = run(server, z, pretend.format("made-up-id"))
    assert "was not started as kernel made-up-id" in err, (out, err)
    assert all(record.kernel_id != "made-up-id" for record in _records(node))

    # X itself may take a slice again, and keeps its name and path (the panel's row).
    out, err = run(server, x, "%gpu request 1G")
    assert "GPU slice: 1G" in out, (out, err)
    view = server.request("GET", f"{API}/kernels/{x}").body
    assert (view["state"], view["kernel_name"], view["path"]) == ("running", "python3-gpu-4g", "work/x.ipynb")
    assert_invariants(node.ledger_path)


def _records(node: Node) -> list[Any]:
    ledger = Ledger(node.ledger_path)
    try:
        return ledger.records()
    finally:
        ledger.close()


# ---- 4 and 5. the REST edge: bodies and sizes ------------------------------------------------------


def test_hostile_bodies_and_odd_sizes_get_a_clear_4xx(node: Node, server: JupyterServer) -> None:
    big = start(server, gpu_memory="12G")  # best fit: the T4 (GPU2), 4G left there
    small = start(server, gpu_memory="4096")  # stored as 4G, on the T4 too
    assert (big["device"], small["device"], small["size"]) == (2, 2, "4G")
    kernel = f"{API}/kernels/{small['kernel_id']}"

    deep = b'{"gpu_memory": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    refusals = [
        ("POST", f"{API}/kernels", deep, "nests deeper"),
        ("PATCH", kernel, deep, "nests deeper"),
        ("POST", f"{API}/kernels", b'{"path": "\\ud800"}', "lone UTF-16 surrogate"),
        ("POST", f"{API}/kernels", json.dumps({"path": "p" * 5_000_000}).encode(), "bytes are accepted"),
        ("POST", f"{API}/kernels", json.dumps({"path": "p" * 5000}).encode(), "path is 5000 bytes"),
        ("POST", f"{API}/kernels", json.dumps({"path": "a\u0000b"}).encode(), "control characters"),
        ("POST", f"{API}/kernels", json.dumps({"path": "a\nb.ipynb"}).encode(), "control characters"),
        ("POST", f"{API}/kernels", json.dumps({"gpu_memory": "٤G"}).encode(), "not 0-9"),
        ("POST", f"{API}/kernels", json.dumps({"gpu_memory": "４G"}).encode(), "not 0-9"),
        ("POST", f"{API}/kernels", json.dumps({"gpu_memory": "  4 G "}).encode(), "space inside"),
        ("POST", f"{API}/kernels", json.dumps({"gpu_memory": "0.0000001G"}).encode(), "at least 256M"),
    ]
    for method, path, raw, words in refusals:
        answer = server.request(method, path, raw=raw)
        expected = 413 if words == "bytes are accepted" else 400  # too large: 413, else 400
        assert answer.status == expected and words in answer.body["message"], (method, path, raw[:60], answer)

    answer = server.request("PATCH", kernel, {"gpu_memory": "50%"})
    assert (
        answer.status == 409
        and "50% does not fit: 0M free on GPU2, so this kernel can grow to 4G" in answer.body["message"]
    ), answer
    assert "%%" not in answer.body["message"]
    answer = server.request("PATCH", kernel, {"gpu_memory": "999999G"})
    assert answer.status == 409 and "(largest: 80G on GPU0)" in answer.body["message"], answer
    answer = server.request("PATCH", kernel, {"gpu_memory": "40G"})
    assert answer.status == 409 and "larger than GPU2 (16G)" in answer.body["message"], answer

    views = server.request("GET", f"{API}/kernels").body
    assert len(views) == 2 and all("\x00" not in view["path"] for view in views)
    assert reserved(server) == [0, 0, 16 * GiB]  # nothing was changed by any of it
    assert_invariants(node.ledger_path)
