"""Which process holds a slice, identified so that a reused pid is not mistaken for it.

A process is its pid and when it started. The start is read as the kernel keeps it: clock ticks
after boot (``/proc/<pid>/stat``), which no clock change moves. psutil's creation time is that
count plus the boot time the kernel derives from the wall clock at each read, so an NTP
adjustment of the clock moves every process's creation time by a second at once: a live
server's queued request, or a live kernel's slice, then looked like a dead process's and was
deleted without a word.

Both figures count from boot, so a process of the next boot can have the pid and start of one
of the last: the ledger forgets the processes of an earlier boot when it is first opened after a
restart (``boot_id``).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from jupyter_gpushare.core.records import ProcessIdentity

_PROC = Path("/proc")
_HAS_PROC = (_PROC / "self" / "stat").is_file()
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if _HAS_PROC else 100
# Two reads of one process's start give the same tick count; half a tick tells them apart from
# any other process's start.
_START_TOLERANCE = 0.5 / _CLOCK_TICKS


def _stat(pid: int) -> tuple[str, float] | None:
    """``pid``'s state letter and start (seconds after boot), or None when it does not exist."""
    if not _HAS_PROC:  # no procfs: psutil's creation time, which follows the clock
        try:
            process = psutil.Process(pid)
            return process.status()[:1].upper(), process.create_time()
        except psutil.NoSuchProcess:
            return None
    if pid <= 0:
        return None
    try:
        text = (_PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        _hidden_or_gone(pid)
        return None
    # The command name in parentheses may hold spaces and parentheses: the fields follow the last ")".
    fields = text[text.rindex(b")") + 2 :].split()
    return fields[0].decode("ascii", "replace"), int(fields[19]) / _CLOCK_TICKS


def boot_id() -> str | None:
    """This boot of the machine (``/proc/sys/kernel/random/boot_id``: new at every boot, the same
    in every container of the host), or None where there is none to read."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def _hidden_or_gone(pid: int) -> None:
    """Raise PermissionError when ``pid`` runs but procfs hides it (``hidepid=2``: another
    user's processes are not listed at all); return when there is no such process. Without
    this a live server or kernel of another user looked dead, and its slice was deleted."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # no such process; a pid beyond any pid_t
        return
    except PermissionError:
        raise PermissionError(f"process {pid} is another user's, hidden by procfs") from None
    # Ours to signal yet not listed: it ended between the two looks.


def started(pid: int) -> float | None:
    """When process ``pid`` started (seconds after boot), or None if there is no such process or
    its start cannot be read (another user's, under procfs ``hidepid``)."""
    try:
        found = _stat(pid)
    except (PermissionError, psutil.AccessDenied):
        return None  # an identity we cannot read is none: refused by name, never a crash
    return None if found is None else found[1]


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of a running process, or None if there is none with that pid."""
    start = started(pid)
    return None if start is None else ProcessIdentity(pid, start)


def current_process() -> ProcessIdentity:
    identity = identify(os.getpid())
    assert identity is not None  # this process exists
    return identity


def is_alive(identity: ProcessIdentity) -> bool:
    """True while the very process ``identity`` names runs (not a zombie, not a reused pid)."""
    try:
        found = _stat(identity.pid)
    except (PermissionError, psutil.AccessDenied):
        return True  # another user's live process: it exists, we just may not inspect it
    if found is None or abs(found[1] - identity.start) > _START_TOLERANCE:
        return False
    return found[0] != "Z"


def same_process(one: ProcessIdentity, other: ProcessIdentity) -> bool:
    """Whether two identities name the same process."""
    return one.pid == other.pid and abs(one.start - other.start) <= _START_TOLERANCE


def lineage(process: ProcessIdentity) -> list[ProcessIdentity]:
    """``process`` and its ancestors up to init, nearest first, each identified by its start
    time; empty when ``process`` is gone (or its pid was reused)."""
    found = identify(process.pid)
    if found is None or not same_process(found, process):
        return []
    try:
        parents = psutil.Process(process.pid).parents()
    except psutil.Error:
        return []
    line = [process]
    for parent in parents:
        found = identify(parent.pid)
        if found is not None:  # else it ended while we looked: its children were handed on
            line.append(found)
    return line


def runs_within(process: ProcessIdentity, ancestor: ProcessIdentity) -> bool:
    """True when ``process`` is ``ancestor`` or runs under it (a kernel started through a
    wrapper such as ``conda run`` is the wrapper's child)."""
    if same_process(process, ancestor):
        return True
    if not is_alive(ancestor):
        return False
    try:
        parents = psutil.Process(process.pid).parents()
    except psutil.Error:
        return False
    return any(parent.pid == ancestor.pid for parent in parents)
