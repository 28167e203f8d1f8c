"""Which process made a kernel's pod and Secret, so a dead server's objects can be collected.

Every object carries a holder annotation ``host/pid/start`` of the process that created it. A
server collects its own orphans — objects of its server label whose holder process is gone —
when it starts its first kernel. Only a process on this host can be judged: one on another host
counts as alive.
"""

from __future__ import annotations

import socket
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.manifests import HOLDER_ANNOTATION
from jupyter_gpushare.backends.processes import is_alive
from jupyter_gpushare.core.records import ProcessIdentity


def holder_text(identity: ProcessIdentity) -> str:
    return f"{socket.gethostname()}/{identity.pid}/{identity.start!r}"


def holder_alive(text: str) -> bool:
    """Whether the process named by a holder annotation still runs (unknown hosts count as alive:
    only a process on this host can be judged)."""
    try:
        host, pid, start = text.split("/")
        identity = ProcessIdentity(int(pid), float(start))
    except ValueError:
        return False  # not ours to trust: a malformed holder is an orphan
    if host != socket.gethostname():
        return True
    return is_alive(identity)


def is_orphan(obj: dict[str, Any]) -> bool:
    """Whether a kernel object's creating process is gone (or it names none)."""
    holder = ((obj.get("metadata") or {}).get("annotations") or {}).get(HOLDER_ANNOTATION)
    return not (holder and holder_alive(str(holder)))
