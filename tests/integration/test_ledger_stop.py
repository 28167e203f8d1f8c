"""A server and a broker stop on SIGTERM whatever became of their ledger (issue 37).

A real ``jupyter server`` with a running kernel holding a whole card, and a real ``jupyter
gpushare broker`` holding a slice, both on the local backend and both run as an OS user made for
the module (root writes any file, so only another user's process meets a read-only ledger).
As in the report, each ledger is first deleted and put back by its process, so that the
process's threads reopen their connections to it (the report's server then crashed in the
kernels' cleanup and never stopped); then it is broken in one of the ways
test_ledger_faults.py breaks it: deleted again, overwritten with 40 kB of random bytes,
truncated, made read-only (chmod), made immutable (``chattr +i``). Once the process has said so,
SIGTERM: it exits within 10 s, and from the fault to its exit its log names the ledger file in
one line, with no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.broker.app import HOUSEKEEPING_EVERY
from jupyter_gpushare.config.kernelspecs import install_kernelspecs

from ..support.polling import wait_until
from ..support.servers import execute, wait_ready
from ..support.teambox import OSUser, TeamBox, create_user, remove_user, user_python

pytestmark = pytest.mark.integration

FORMS = ("deleted", "damaged", "truncated", "read-only", "immutable")
STOPS_WITHIN = 10.0  # seconds from SIGTERM to the process's exit
FOLLOWED = "to its restored file"  # a reader reopening the ledger its process put back
GENEROUS = 60.0  # seconds for what a loaded 2-core machine does in one or two (a start, a report)
USER = f"gpu-stop-{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    """The module's user, a Python it can run and the kernelspecs; no broker of root's."""
    root = Path(tempfile.mkdtemp(prefix="gpushare-stop-"))
    root.chmod(0o755)
    (root / "logs").mkdir()
    install_kernelspecs(["4G"], prefix=str(root / "prefix"))
    made = TeamBox(root, root / "unused.sock", root / "unused.sqlite", {}, user_python(root))
    try:
        made.users[USER] = create_user(USER, root)
        yield made
    finally:
        for server in made.servers:
            server.stop()
        for user in made.users.values():
            remove_user(user)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def ledger(box: TeamBox, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A ledger path in a directory of the user's own, one per test (each breaks its own)."""
    user = box.users[USER]
    directory = box.root / f"ledger-{request.node.callspec.id}-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    os.chown(directory, user.uid, user.gid)
    path = directory / "ledger.sqlite"
    try:
        yield path
    finally:
        for leftover in glob.glob(f"{path}*"):
            subprocess.run(["chattr", "-i", leftover], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o755)


def own_ledger(ledger: Path) -> dict[str, str]:
    """A process's environment for ``ledger``: the local backend on one simulated card."""
    return {
        "JUPYTER_GPUSHARE_BROKER_URL": "",
        "JUPYTER_GPUSHARE_LEDGER_PATH": str(ledger),
        "JUPYTER_GPUSHARE_SIMULATE": "1xA100-80GB",
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.2",
    }


def can_make_immutable(directory: Path) -> bool:
    probe = directory / "chattr-probe"
    probe.touch()
    try:
        return subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False).returncode == 0
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
        probe.unlink()


def put_back_once(ledger: Path, log: LogSince) -> None:
    """Delete every ledger file and wait until the process has put the ledger back."""
    for path in glob.glob(f"{ledger}*"):
        os.unlink(path)
    wait_until(
        lambda: ledger.exists() and "was deleted; put back" in log.text(),
        GENEROUS,
        message="the deleted ledger put back by its process",
    )


def break_ledger(ledger: Path, form: str) -> None:
    if form == "deleted":
        for path in glob.glob(f"{ledger}*"):
            os.unlink(path)
    elif form == "damaged":
        ledger.write_bytes(os.urandom(40_000))  # in place, as the report's
    elif form == "truncated":
        os.truncate(ledger, 0)
    elif form == "read-only":
        ledger.chmod(0o444)
        ledger.parent.chmod(0o555)
    elif form == "immutable":
        if not can_make_immutable(ledger.parent):
            pytest.fail(f"this filesystem has no chattr +i ({ledger.parent}): no immutable ledger to stop on")
        subprocess.run(["chattr", "+i", str(ledger)], check=True)
    else:
        raise AssertionError(form)


class LogSince:
    """A process's log from a point on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = 0

    def mark(self) -> None:
        self.start = len(self.path.read_bytes())

    def text(self) -> str:
        return self.path.read_bytes()[self.start :].decode(errors="replace")


def said_so(log: LogSince, ledger: Path, form: str) -> None:
    """Wait until the process has logged the fault (a deleted ledger: that it put it back)."""
    wait_until(
        lambda: (str(ledger) in log.text()) and (form != "deleted" or ledger.exists()),
        GENEROUS,
        message=f"the {form} ledger reported in the log",
    )


def stop_and_judge(process: subprocess.Popen[bytes], log: LogSince, ledger: Path) -> None:
    """SIGTERM: the process must exit within STOPS_WITHIN, and its log since the fault name the
    ledger in exactly one line, with no traceback."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOPS_WITHIN)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(
            f"still running {STOPS_WITHIN:g} s after SIGTERM; its log since the fault:\n{log.text()[-6000:]}"
        )
    since = log.text()
    # A reader of the ledger that first looks after the fault may say it follows the file put
    # back before it (``put_back_once``): news of that put-back, not of the fault (the process
    # has more than one reader, and none says when it has reopened; in CI one said so 0.2 s
    # after the fault was reported).
    naming = [line for line in since.splitlines() if str(ledger) in line and FOLLOWED not in line]
    assert len(naming) == 1, f"{len(naming)} lines name the ledger:\n{since[-6000:]}"
    assert "Traceback" not in since, since[-6000:]


# ---- the server ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_a_server_with_a_running_kernel_stops_on_sigterm_with_its_ledger(
    box: TeamBox, ledger: Path, form: str
) -> None:
    user = box.users[USER]
    server = wait_ready(box.server(user, f"server-{form}", **own_ledger(ledger)), GENEROUS)
    started = server.request(
        "POST", "/api/gpushare/kernels", {"name": "python3-gpu-4g", "gpu_memory": "whole"}, timeout=GENEROUS
    )
    assert started.status == 201 and started.body["state"] == "running", started
    # Running, not still importing (killed then, a kernel prints a traceback of its own).
    assert asyncio.run(execute(server, started.body["kernel_id"], "print(6 * 7)", GENEROUS)) == ("42\n", "")
    kernels = psutil.Process(server.process.pid).children(recursive=True)
    assert kernels, "the kernel's process"
    log = LogSince(server.log_path)
    log.mark()
    put_back_once(ledger, log)

    log.mark()
    break_ledger(ledger, form)
    said_so(log, ledger, form)
    stop_and_judge(server.process, log, ledger)
    # The kernel was shut down, not left behind by a process that gave up.
    _, alive = psutil.wait_procs(kernels, timeout=STOPS_WITHIN)
    assert not alive, alive
    if form == "deleted":  # put back, the ledger took the shutdown's release
        after = Ledger(ledger)
        try:
            assert after.records() == []
        finally:
            after.close()


# ---- the broker ---------------------------------------------------------------------------------


def start_broker(box: TeamBox, user: OSUser, ledger: Path, socket: Path) -> subprocess.Popen[bytes]:
    log_path = box.root / "logs" / f"broker-{ledger.parent.name}.log"
    process = subprocess.Popen(
        [str(box.python), "-m", "jupyter_gpushare.cli", "broker", "--socket", str(socket)],
        env=box.env_for(user, **own_ledger(ledger)),
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        **user.popen_arguments(),
    )
    client = BrokerClient(f"unix:{socket}")

    def answers() -> bool:
        assert process.poll() is None, log_path.read_text(errors="replace")
        with contextlib.suppress(UnreachableError):
            client.call("GET", "info")
            return True
        return False

    wait_until(answers, GENEROUS, message="the broker answering")
    return process


@pytest.mark.parametrize("form", FORMS)
def test_a_broker_holding_a_slice_stops_on_sigterm_with_its_ledger(
    box: TeamBox, ledger: Path, form: str
) -> None:
    user = box.users[USER]
    socket = ledger.parent / "run" / "broker.sock"
    broker = start_broker(box, user, ledger, socket)
    try:
        client = BrokerClient(f"unix:{socket}")
        # A slice this test process holds (the broker keeps it while the process lives).
        placed = client.call("POST", "slices", {"kernel_id": str(uuid.uuid4()), "gpu_memory": "whole"})
        assert placed["state"] == "placed", placed
        log = LogSince(box.root / "logs" / f"broker-{ledger.parent.name}.log")
        log.mark()
        put_back_once(ledger, log)

        log.mark()
        break_ledger(ledger, form)
        said_so(log, ledger, form)
        # The scenario, not a wait for state: the broker runs on with the broken ledger for a
        # round of its housekeeping, which meets the fault too.
        time.sleep(1.5 * HOUSEKEEPING_EVERY)
        stop_and_judge(broker, log, ledger)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
