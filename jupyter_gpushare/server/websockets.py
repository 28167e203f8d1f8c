"""Browsers reconnect to a kernel that came back in a new pod.

A kernel pod that restarts (a resize, ``%gpu resize --restart``, the server restarting a pod that
died) has a new address and new ports. jupyter_server's open websockets keep their channels to
the old pod, and JupyterLab reconnects by itself only after restarts it asked for. Closing the
kernel's websockets makes every browser reconnect; jupyter_server then sees the new ports and
opens channels to the new pod.
"""

from __future__ import annotations

import logging

log = logging.getLogger("jupyter_gpushare")


def close_kernel_websockets(kernel_id: str) -> int:
    """Close the open websockets of ``kernel_id`` (their clients reconnect); how many.

    jupyter_server keeps its open kernel websockets by ``"<kernel id>:<session>"`` in a class
    attribute of its websocket connection; there is no public call for this, and without the
    attribute (another connection class) nothing is closed.
    """
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    open_sessions = getattr(ZMQChannelsWebsocketConnection, "_open_sessions", None)
    if not isinstance(open_sessions, dict):
        return 0
    closed = 0
    for key, handler in list(open_sessions.items()):
        if str(key).startswith(f"{kernel_id}:"):
            # Closed (1012: service restart), then dropped at once: the closing handshake waits
            # on the browser (seconds, at times), and what it sends meanwhile would go nowhere.
            stream = getattr(getattr(handler, "ws_connection", None), "stream", None)
            handler.close(1012, "the kernel restarted in a new pod")
            if stream is not None:
                stream.close()
            closed += 1
    if closed:
        log.info("Kernel %s runs in a new pod: %d browser connection(s) reconnect", kernel_id, closed)
    return closed
