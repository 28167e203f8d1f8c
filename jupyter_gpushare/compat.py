"""Every private detail of another library that jupyter-gpushare relies on, in one place.

Each entry names the upstream version it was checked against, and tests/unit/test_compat.py
fails when the upstream behaviour it works around changes — then the workaround can go.
"""

from __future__ import annotations

from typing import Any

from tornado.web import HTTPError


def forget_pending_kernel(multi_kernel_manager: Any, kernel_id: str) -> None:
    """Drop ``kernel_id`` from a multi-kernel manager's pending starts after its start failed.

    jupyter_client (checked: 8.10.0) keeps a kernel whose start raised in
    ``MultiKernelManager._pending_kernels`` for ever, and a server's shutdown then waits on it
    (~30 s). A refused GPU request must not cost a hung shutdown; there is no public call.
    Without the attribute (another manager) there is nothing to do.
    """
    pending = getattr(multi_kernel_manager, "_pending_kernels", None)
    if isinstance(pending, dict):
        pending.pop(kernel_id, None)


def pending_kernel_starts(multi_kernel_manager: Any) -> dict[str, Any]:
    """A multi-kernel manager's starts in flight, by kernel id (their tasks).

    jupyter_client (checked: 8.10.0) keeps them in ``MultiKernelManager._pending_kernels`` and
    ``list_kernel_ids()`` leaves them out; jupyter_server's ``shutdown_all`` then asks to shut
    each down and fails with 404 for it ("Kernel does not exist"), leaving the start to finish
    after the shutdown. While a server stops, the kernels' shutdowns are kept there too. A copy;
    empty where the attribute is missing (another manager).
    """
    pending = getattr(multi_kernel_manager, "_pending_kernels", None)
    return dict(pending) if isinstance(pending, dict) else {}


def watch_new_kernel_activity(mapping_kernel_manager: Any, kernel_id: str) -> bool:
    """Make a server's watch of a kernel's activity follow the kernel to a new address.

    jupyter_server (checked: 2.21.1) follows a kernel's execution state on an iopub socket of its
    own (``kernel._activity_stream``), made once at the start and again only in its own
    ``restart_kernel`` when the ports changed. A kernel its restarter brought back (after its
    pod was OOMKilled) in a new pod at another address would be watched at the old one for
    ever: ``GET /api/kernels`` says "busy" (the cell that died) and the culler never sees it
    idle. ``stop_watching_activity`` would also end a pending restart's wait for its
    ``kernel_info`` reply, so only the socket is closed here. False where the manager does not
    know the kernel or has no such watch.
    """
    kernels = getattr(mapping_kernel_manager, "_kernels", None)
    kernel = kernels.get(kernel_id) if isinstance(kernels, dict) else None
    if kernel is None or not hasattr(mapping_kernel_manager, "start_watching_activity"):
        return False
    stream = getattr(kernel, "_activity_stream", None)
    if stream is not None and not stream.socket.closed:
        stream.close()
    kernel._activity_stream = None
    kernel.execution_state = "starting"  # the new kernel's first status is taken as it comes
    mapping_kernel_manager.start_watching_activity(kernel_id)
    return True


# Seconds a shutdown waits for an abandoned restart to settle before it goes on regardless.
RESTART_SETTLES_WITHIN = 30.0


def shutdown_stops_restarts(mapping_kernel_manager: Any) -> bool:
    """Let a server shut down a kernel whose restart still waits for its new pod.

    jupyter_client (checked: 8.10.0) ``MultiKernelManager._async_shutdown_kernel`` asks
    ``km.ready.exception()`` of every kernel it shuts down; during a restart ``ready`` is the
    restart's unfinished start, and the call raises ``InvalidStateError``: jupyter_server answers
    500 and the kernel keeps waiting. A kernel pod's restart can wait long — under Kueue a
    preempted kernel's new pod waits for quota. So the manager's shutdown is wrapped (on this
    instance, as jupyter_server calls it: ``shutdown_kernel``, and ``_async_shutdown_kernel`` for
    ``shutdown_all``): a kernel whose restart is pending has its provisioner abandon the start
    (``abandon_launch``: its pod is withdrawn), its restarter stopped, and the start's failure
    awaited; then the manager's own shutdown runs, and removes the kernel. Kernels without a
    pending restart, or whose provisioner cannot abandon one, are shut down as before. False where
    the manager has no such method (another manager).
    """
    original = getattr(mapping_kernel_manager, "_async_shutdown_kernel", None)
    if original is None or getattr(original, "_gpushare_stops_restarts", False):
        return False

    async def shutdown(kernel_id: str, now: bool = False, restart: bool = False) -> Any:
        if not restart:
            await _abandon_pending_restart(mapping_kernel_manager, kernel_id)
        return await original(kernel_id, now=now, restart=restart)

    shutdown._gpushare_stops_restarts = True  # type: ignore[attr-defined]
    mapping_kernel_manager._async_shutdown_kernel = shutdown
    mapping_kernel_manager.shutdown_kernel = shutdown
    return True


async def _abandon_pending_restart(mapping_kernel_manager: Any, kernel_id: str) -> None:
    import asyncio
    import contextlib

    kernels = getattr(mapping_kernel_manager, "_kernels", None)
    kernel = kernels.get(kernel_id) if isinstance(kernels, dict) else None
    ready = getattr(kernel, "_ready", None)
    if kernel is None or not isinstance(ready, asyncio.Future) or ready.done():
        return
    if kernel_id in pending_kernel_starts(mapping_kernel_manager):
        return  # a first start, not a restart: the manager waits for it itself
    abandon = getattr(getattr(kernel, "provisioner", None), "abandon_launch", None)
    if not callable(abandon) or not abandon():
        return
    with contextlib.suppress(Exception):
        kernel.stop_restarter()
    # The start now fails (its exception is the restart's; the shutdown goes on without it).
    with contextlib.suppress(Exception, asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(ready), RESTART_SETTLES_WITHIN)


def open_kernel_websockets() -> dict[str, Any]:
    """jupyter_server's open kernel websockets, by ``"<kernel id>:<session>"``.

    jupyter_server (checked: 2.21.1) keeps them in the class attribute
    ``ZMQChannelsWebsocketConnection._open_sessions``; there is no public registry. An empty
    dict where the attribute is missing (another connection class): nothing can be closed.
    """
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    sessions = getattr(ZMQChannelsWebsocketConnection, "_open_sessions", None)
    return sessions if isinstance(sessions, dict) else {}


def close_websocket_now(handler: Any, code: int, reason: str) -> None:
    """Close a tornado websocket with ``code`` and drop its connection at once.

    tornado (checked: 6.6.1) waits for the peer's closing handshake (Chromium takes seconds at
    times, and what a browser sends meanwhile goes nowhere); the stream it waits on is
    ``handler.ws_connection.stream``, not public. Without it, the close is the ordinary one.
    """
    stream = getattr(getattr(handler, "ws_connection", None), "stream", None)
    handler.close(code, reason)
    if stream is not None:
        stream.close()


class ExactLogMessage(HTTPError):
    """An ``HTTPError`` whose ``log_message`` is the sentence as written.

    tornado (checked: 6.6.1) escapes ``%`` in ``HTTPError.log_message`` when there are no format
    arguments, for old callers that format it themselves; jupyter_server's ``APIHandler`` shows
    ``log_message`` as it is, so "50% does not fit" would read "50%% does not fit". The sentence
    is kept in tornado's private ``_log_message``.
    """

    @property  # type: ignore[override]
    def log_message(self) -> str | None:
        message = getattr(self, "_log_message", None)
        return None if message is None else str(message)

    @log_message.setter
    def log_message(self, value: str | None) -> None:
        self._log_message = value
