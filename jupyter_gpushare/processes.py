"""Which process holds a slice, identified so that a reused pid is not mistaken for it."""

from __future__ import annotations

import os

import psutil

from .records import ProcessIdentity

# psutil derives start times from boot time and clock ticks: equal to 1/100 s for one process.
_START_TOLERANCE = 0.05


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of a running process, or None if there is none with that pid."""
    try:
        return ProcessIdentity(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def current_process() -> ProcessIdentity:
    identity = identify(os.getpid())
    assert identity is not None  # this process exists
    return identity


def is_alive(identity: ProcessIdentity) -> bool:
    """True while the very process ``identity`` names runs (not a zombie, not a reused pid)."""
    try:
        process = psutil.Process(identity.pid)
        if abs(process.create_time() - identity.start) > _START_TOLERANCE:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's live process: it exists, we just may not inspect it


def same_process(one: ProcessIdentity, other: ProcessIdentity) -> bool:
    """Whether two identities name the same process (start times agree to psutil's precision)."""
    return one.pid == other.pid and abs(one.start - other.start) <= _START_TOLERANCE


def lineage(process: ProcessIdentity) -> list[ProcessIdentity]:
    """``process`` and its ancestors up to init, nearest first, each identified by its start
    time; empty when ``process`` is gone (or its pid was reused)."""
    try:
        found = psutil.Process(process.pid)
        if abs(found.create_time() - process.start) > _START_TOLERANCE:
            return []
        parents = found.parents()
    except psutil.Error:
        return []
    line = [process]
    for parent in parents:
        try:
            line.append(ProcessIdentity(parent.pid, parent.create_time()))
        except psutil.Error:  # it ended while we looked: its children were handed on
            continue
    return line


def runs_within(process: ProcessIdentity, ancestor: ProcessIdentity) -> bool:
    """True when ``process`` is ``ancestor`` or runs under it (a kernel started through a
    wrapper such as ``conda run`` is the wrapper's child)."""
    if process == ancestor or (
        process.pid == ancestor.pid and abs(process.start - ancestor.start) <= _START_TOLERANCE
    ):
        return True
    if not is_alive(ancestor):
        return False
    try:
        parents = psutil.Process(process.pid).parents()
    except psutil.Error:
        return False
    return any(parent.pid == ancestor.pid for parent in parents)
