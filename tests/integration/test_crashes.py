"""``kill -9`` of a kernel, or of the process that started it, leaks no slice.

After the crash, the next ``jupyter gpushare status`` (a separate process, as a user would run
it) reconciles the ledger and shows nothing reserved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ..support.kernels import STARTER, wait_for_exit
from ..support.nodes import BIN, Node

pytestmark = pytest.mark.integration


def start_kernel_in_another_process(node: Node) -> tuple[subprocess.Popen[str], str, int]:
    starter = subprocess.Popen(
        [sys.executable, str(STARTER), "python3-gpu-16g"],
        env=node.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    line = starter.stdout.readline().split()
    assert len(line) == 2, f"starter failed (exit {starter.poll()})"
    return starter, line[0], int(line[1])


def status(node: Node) -> dict:  # type: ignore[type-arg]
    result = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "status", "--json"],
        env=node.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def reserved_in(report: dict) -> int:  # type: ignore[type-arg]
    return sum(device["memory_reserved"] for device in report["pool"]["devices"])


def test_kill_9_of_the_kernel_frees_its_slice_at_the_next_status(node: Node) -> None:
    starter, kernel_id, kernel_pid = start_kernel_in_another_process(node)
    try:
        before = status(node)
        assert [kernel["kernel_id"] for kernel in before["kernels"]] == [kernel_id]
        assert reserved_in(before) == 16 * 1024**3

        os.kill(kernel_pid, signal.SIGKILL)
        wait_for_exit(kernel_pid)

        after = status(node)
        assert after["kernels"] == []
        assert reserved_in(after) == 0
        assert starter.poll() is None, "the starter should still be alive: only the kernel died"
    finally:
        starter.kill()
        starter.wait()


def test_kill_9_of_the_starting_process_frees_the_slice_at_the_next_status(node: Node) -> None:
    starter, kernel_id, kernel_pid = start_kernel_in_another_process(node)
    assert [kernel["kernel_id"] for kernel in status(node)["kernels"]] == [kernel_id]

    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    # The orphaned kernel notices its parent is gone and exits (ipykernel's parent poller);
    # until it does, its slice is honestly still in use.
    wait_for_exit(kernel_pid)

    after = status(node)
    assert after["kernels"] == []
    assert reserved_in(after) == 0


def test_kill_9_of_both_at_once_frees_the_slice(node: Node) -> None:
    starter, _, kernel_pid = start_kernel_in_another_process(node)
    os.kill(kernel_pid, signal.SIGKILL)
    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    wait_for_exit(kernel_pid)
    assert status(node)["kernels"] == []
