"""The tests' one polling helper (tests/support/polling.py): it returns what it waited for, and a wait
that never ends fails the test with what it waited for and the last value read."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.support.polling import async_wait_until, wait_until


def test_wait_until_returns_the_first_true_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", 5, 0.001) == "ready"


def test_until_checks_the_value_read_and_the_value_is_returned() -> None:
    counter = itertools.count()
    assert wait_until(lambda: {"n": next(counter)}, 5, 0.001, until=lambda value: value["n"] == 2) == {"n": 2}


def test_a_condition_never_reached_fails_with_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(
        AssertionError, match=r"^the pod running not reached within 0\.05 s; last value: 'Pending'$"
    ):
        wait_until(lambda: "Pending", 0.05, 0.01, "the pod running", until=lambda phase: phase == "Running")


async def test_the_async_twin_awaits_coroutine_conditions_and_returns_their_value() -> None:
    counter = itertools.count()

    async def alive() -> bool:
        return next(counter) < 3

    assert await async_wait_until(alive, 5, 0.001, until=lambda value: not value) is False
    assert await async_wait_until(lambda: next(counter), 5, 0.001) == 4


async def test_the_async_twin_fails_like_the_sync_one() -> None:
    with pytest.raises(
        AssertionError, match=r"^the kernel ended not reached within 0\.05 s; last value: True$"
    ):
        await async_wait_until(lambda: True, 0.05, 0.01, "the kernel ended", until=lambda alive: not alive)


# ---- no wait loop without a deadline ------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
# The simulated node side's loops (tests/cluster/) are the kubelet's own: they run until the node
# side stops, as a kubelet's do, and wait on nothing a test asked for.
CHECKED = ("tests", "benchmarks")
NOT_CHECKED = ("tests/cluster",)
SLEEPS = {"sleep", "wait_for_timeout"}
CLOCKS = {"monotonic", "perf_counter"}


def _names(node: ast.AST) -> set[str]:
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, (ast.Name, ast.Attribute))
    }


def deadline_less_wait_loops(path: Path) -> list[int]:
    """The lines of ``while`` loops in ``path`` that sleep between two looks at some state but
    read no deadline (a name with "deadline" in it) and whose condition reads no clock, unless
    the ``while`` line says why with a ``# no deadline:`` comment."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for loop in ast.walk(ast.parse(source)):
        if not isinstance(loop, ast.While):
            continue
        sleeps = any(
            isinstance(call, ast.Call)
            and (call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", ""))
            in SLEEPS
            for call in ast.walk(loop)
        )
        if not sleeps or any("deadline" in name for name in _names(loop)):
            continue
        if _names(loop.test) & CLOCKS:  # runs for a time ("while monotonic() - since < OUTAGE")
            continue
        if "# no deadline:" not in lines[loop.lineno - 1]:
            found.append(loop.lineno)
    return found


def test_no_wait_loop_of_the_tests_or_benchmarks_goes_without_a_deadline() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in CHECKED
        for path in sorted((REPO / folder).rglob("*.py"))
        if not path.relative_to(REPO).as_posix().startswith(NOT_CHECKED)
        for line in deadline_less_wait_loops(path)
    ]
    assert offenders == [], (
        "wait with tests/support/polling.py (wait_until, async_wait_until), or give the loop a "
        f"deadline: {offenders}"
    )


def test_the_check_finds_a_wait_loop_without_a_deadline(tmp_path: Path) -> None:
    waits = tmp_path / "waits.py"
    waits.write_text(
        "import time\n"
        "def up(server):\n"
        "    while not server.ready():\n"
        "        time.sleep(0.1)\n"
        "def bounded(server):\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not server.ready():\n"
        "        assert time.monotonic() < deadline\n"
        "        time.sleep(0.1)\n"
        "def sampler(done):\n"
        "    while not done.is_set():  # no deadline: samples until the test is done\n"
        "        time.sleep(0.1)\n"
    )
    assert deadline_less_wait_loops(waits) == [3]
