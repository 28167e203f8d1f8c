"""Browsers reconnect to a kernel that came back in a new pod.

A kernel pod that restarts (a resize, ``%gpu resize --restart``, the server restarting a pod that
died) has a new address and new ports. jupyter_server's open websockets keep their channels to
the old pod, and JupyterLab reconnects by itself only after restarts it asked for. Closing the
kernel's websockets makes every browser reconnect; jupyter_server then sees the new ports and
opens channels to the new pod.
"""

from __future__ import annotations

import logging

from jupyter_gpushare.compat import close_websocket_now, open_kernel_websockets

log = logging.getLogger("jupyter_gpushare")


def close_kernel_websockets(kernel_id: str) -> int:
    """Close the open websockets of ``kernel_id`` (their clients reconnect); how many.

    jupyter_server keeps no public registry of them (see ``compat.open_kernel_websockets``);
    where its private one is missing nothing is closed.
    """
    open_sessions = open_kernel_websockets()
    closed = 0
    for key, handler in list(open_sessions.items()):
        if str(key).startswith(f"{kernel_id}:"):
            close_websocket_now(handler, 1012, "the kernel restarted in a new pod")
            closed += 1
    if closed:
        log.info("Kernel %s runs in a new pod: %d browser connection(s) reconnect", kernel_id, closed)
    return closed
