"""The broker's door in pure parts (issue #20): which kernel a process belongs to, what it may act
on, waiting requests nobody asks after, connection shares, text for a terminal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from jupyter_gpushare.backends.broker_base.authority import kernel_in_lineage, kernel_scope_refusal
from jupyter_gpushare.backends.broker_base.waiting import WaitingLeases
from jupyter_gpushare.backends.processes import current_process, identify, lineage
from jupyter_gpushare.broker.door import Door, Throttled, raise_open_files_limit
from jupyter_gpushare.broker.settings import GPUShareBroker
from jupyter_gpushare.core.records import ProcessIdentity
from jupyter_gpushare.core.terminal import printable

SERVER, KERNEL, CHILD = ProcessIdentity(100, 1.0), ProcessIdentity(200, 2.0), ProcessIdentity(300, 3.0)
INIT = ProcessIdentity(1, 0.0)


# ---- which kernel a process belongs to ---------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ([KERNEL, SERVER, INIT], "k1"),  # the kernel itself
        ([CHILD, KERNEL, SERVER, INIT], "k1"),  # a process it started
        ([SERVER, INIT], None),  # the server that started it
        ([CHILD, INIT], None),  # a process that left the tree (its parent is init now)
        ([ProcessIdentity(200, 9.0), SERVER, INIT], None),  # the kernel's pid, reused
        ([], None),  # a process that is gone
    ],
)
def test_a_process_belongs_to_the_nearest_kernel_among_its_ancestors(
    line: list[ProcessIdentity], expected: str | None
) -> None:
    kernels = [("k1", KERNEL), ("k2", ProcessIdentity(201, 2.5))]
    assert kernel_in_lineage(line, kernels) == expected


def test_a_kernel_started_inside_a_kernel_is_its_own() -> None:
    inner = ProcessIdentity(400, 4.0)
    assert kernel_in_lineage([inner, KERNEL, SERVER], [("outer", KERNEL), ("inner", inner)]) == "inner"


def test_a_kernel_acts_on_its_own_slice_only_and_a_user_process_on_any() -> None:
    assert kernel_scope_refusal("k1", None) is None
    assert kernel_scope_refusal("k1", "k1") is None
    refusal = kernel_scope_refusal("k2", "k1")
    assert refusal is not None and "a kernel acts on its own GPU slice only" in refusal and "k2" in refusal


def test_the_lineage_of_a_real_process_runs_up_through_its_parents() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        identity = identify(child.pid)
        assert identity is not None
        line = lineage(identity)
        assert line[0] == identity and line[1].pid == os.getpid()
        assert kernel_in_lineage(line, [("me", current_process())]) == "me"
    finally:
        child.kill()
        child.wait()
    assert lineage(identity) == []  # gone


# ---- waiting requests nobody asks after --------------------------------------------------------


def test_a_waiting_request_goes_once_nobody_asked_after_it_for_the_lease() -> None:
    now = [1000.0]
    leases = WaitingLeases(20.0, clock=lambda: now[0])
    leases.asked("a")
    now[0] += 15
    leases.asked("b")
    assert leases.abandoned(["a", "b", "ghost"]) == []  # "ghost": counted from the broker's start
    now[0] += 10
    assert leases.abandoned(["a", "b", "ghost"]) == ["a", "ghost"]
    now[0] += 11
    assert leases.abandoned(["b"]) == ["b"]
    leases.asked("a")  # asked again after it stopped waiting (a new request under the id)
    assert leases.abandoned(["a"]) == []


def test_requests_that_wait_no_more_are_forgotten() -> None:
    now = [0.0]
    leases = WaitingLeases(5.0, clock=lambda: now[0])
    leases.asked("placed")
    assert leases.abandoned([]) == []
    now[0] += 6
    assert leases.abandoned(["placed"]) == ["placed"]  # not remembered: from the start again


# ---- connections ------------------------------------------------------------------------------


def test_each_user_holds_at_most_their_share_of_connections() -> None:
    door = Door(per_user=2)
    assert door.admit(1000) and door.admit(1000) and not door.admit(1000)
    assert door.admit(1001)  # another user's share is their own
    door.leave(1000)
    assert door.admit(1000) and not door.admit(1000)
    for _ in range(2):
        door.leave(1000)
    door.leave(1001)
    assert not door.open


def test_a_connection_beyond_the_share_is_answered_503_with_the_reason() -> None:
    answer = Door(per_user=64).refusal(os.getuid())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in head
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    assert b"no more than 64 connections" in body and b"max_connections_per_user" in body


def test_out_of_descriptors_the_pending_connection_is_closed_not_left_to_spin() -> None:
    door = Door(per_user=64)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(f"\0gpushare-door-test-{os.getpid()}")
        listener.listen()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(listener.getsockname())
        door.out_of_descriptors(listener, OSError(24, "Too many open files"))
        client.settimeout(5)
        assert client.recv(1) == b""  # accepted on the reserve and closed
        client.close()


def test_a_throttled_log_says_how_many_lines_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    throttled = Throttled(every=3600)
    for _ in range(1000):
        throttled.warning("flood", "refused %s", "x")
    throttled._last["flood"] -= 3601
    throttled.warning("flood", "refused %s", "x")
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["refused x", "refused x (999 more like it in the last 3600 s)"]


def test_the_open_files_soft_limit_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))\n"
        "from jupyter_gpushare.broker.door import raise_open_files_limit\n"
        "raise_open_files_limit()\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "(1024, 1024)"
    raise_open_files_limit()  # here: already as high as allowed, nothing to do


@pytest.mark.parametrize(
    ("trait", "value"), [("max_connections_per_user", 0), ("idle_timeout", 0), ("waiting_lease", -1)]
)
def test_the_door_traits_refuse_values_that_would_shut_it(trait: str, value: float) -> None:
    from traitlets import TraitError

    with pytest.raises(TraitError, match=trait):
        GPUShareBroker(**{trait: value})


# ---- text for a terminal ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("esc\x1b]0;owned\x07\x1b[2J", "esc\\x1b]0;owned\\x07\\x1b[2J"),
        ("nul\x00tab\tcr\r", "nul\\x00tab\\x09cr\\x0d"),
        ("line one\nline two", "line one\nline two"),
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),
        ("c1\x9bcontrol", "c1\\x9bcontrol"),
        ("lone \ud800", "lone \\ud800"),
        ("Ünïcode/ノート.ipynb 👩‍💻", "Ünïcode/ノート.ipynb 👩‍💻"),
    ],
)
def test_printable_shows_control_characters_as_their_escapes(text: str, shown: str) -> None:
    assert printable(text) == shown
