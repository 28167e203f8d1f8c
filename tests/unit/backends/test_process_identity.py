"""A process's identity (pid and start) does not move with the clock, and reads any command name.

A live process must not look dead: a queued start or a slice whose holder 'died' is deleted
without a word (a CI run saw a queued start leave the queue with nothing logged). psutil adds
the boot time the kernel derives from the wall clock at each read, so an NTP adjustment moves
every creation time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import psutil._pslinux
import pytest

from jupyter_gpushare.backends.processes import (
    current_process,
    identify,
    is_alive,
    lineage,
    runs_within,
    same_process,
    started,
)
from jupyter_gpushare.core.records import ProcessIdentity
from tests.support.polling import wait_until


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child whose command name holds a space and parentheses (as /proc/<pid>/stat shows it)."""
    program = tmp_path / "a) b (c"
    shutil.copy("/bin/sleep", program)
    process = subprocess.Popen([str(program), "60"])
    yield process
    process.kill()
    process.wait()


def test_a_clock_change_does_not_make_a_live_process_look_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed before: with the boot time a second later, this very process was 'dead'."""
    before = current_process()
    real_boot_time = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_boot_time() + 1.0)
    assert is_alive(before)
    assert same_process(current_process(), before)
    assert lineage(before)[0] == before


def test_a_command_name_with_spaces_and_parentheses_is_read(child: subprocess.Popen[bytes]) -> None:
    identity = identify(child.pid)
    assert identity is not None
    assert psutil.Process(child.pid).name() == "a) b (c"
    # The same start psutil counts from boot, to the tick.
    from_boot = psutil.Process(child.pid).create_time() - psutil.boot_time()
    assert abs(identity.start - from_boot) < 1.5 / os.sysconf("SC_CLK_TCK")
    assert is_alive(identity)
    assert runs_within(identity, current_process())


def test_a_reused_pid_an_ended_process_and_a_zombie_are_not_alive(child: subprocess.Popen[bytes]) -> None:
    identity = identify(child.pid)
    assert identity is not None
    assert not is_alive(ProcessIdentity(child.pid, identity.start + 0.5))  # another start: a reused pid
    child.kill()  # not reaped yet: a zombie, which holds nothing
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 30, 0.05, "a zombie")
    assert not is_alive(identity)
    child.wait()
    assert not is_alive(identity) and identify(child.pid) is None


@pytest.mark.parametrize("pid", [0, -1, 2**22 + 12345, 2**40, 2**63])  # past any pid_t: no error
def test_no_such_pid(pid: int) -> None:
    assert identify(pid) is None
    assert not is_alive(ProcessIdentity(pid, 1.0))
    assert lineage(ProcessIdentity(pid, 1.0)) == []


def test_an_unreadable_process_has_no_identity_but_counts_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # procfs mounted with hidepid=1: another user's /proc/<pid>/stat is unreadable. Reading an
    # identity must not raise (a ledger fault, an error at the broker's attach), and a slice
    # whose holder we cannot inspect is not taken for a dead process's.
    me = current_process()

    def refused(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused)
    assert identify(me.pid) is None
    assert started(me.pid) is None
    assert is_alive(me)


def test_a_process_procfs_hides_counts_alive_and_a_gone_one_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    # procfs mounted with hidepid=2: another user's process has no /proc/<pid> at all, as if
    # it did not exist, while the kernel still says it does (kill(pid, 0) is refused). Failed
    # before: is_alive answered False, and the ledger deleted a live server's or kernel's slice.
    me = current_process()

    def not_listed(self: Path) -> bytes:
        raise FileNotFoundError(2, "No such file or directory", str(self))

    def someone_elses(pid: int, signal: int) -> None:
        assert signal == 0  # never a real signal
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "read_bytes", not_listed)
    monkeypatch.setattr(os, "kill", someone_elses)
    assert is_alive(me)
    assert identify(me.pid) is None and started(me.pid) is None

    def no_such_process(pid: int, signal: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(os, "kill", no_such_process)
    assert not is_alive(me)
    assert identify(me.pid) is None
