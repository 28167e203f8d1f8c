"""The private details of other libraries in jupyter_gpushare.compat still behave as relied on.

Each test fails when the upstream behaviour changes: then the workaround can go (or must change).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from tornado.web import HTTPError

from jupyter_gpushare.compat import forget_pending_kernel, open_kernel_websockets, watch_new_kernel_activity
from jupyter_gpushare.core.errors import DoesNotFitError
from jupyter_gpushare.http_errors import answerable


async def test_jupyter_client_still_keeps_a_failed_start_pending(tmp_path: Path) -> None:
    """The reason for forget_pending_kernel: without it a server's shutdown waits on the start."""
    spec_dir = tmp_path / "kernels" / "broken"
    spec_dir.mkdir(parents=True)
    argv = [str(tmp_path / "no-such-interpreter"), "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "x", "language": "python"})
    )
    manager = AsyncMultiKernelManager(
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]),
        connection_dir=str(tmp_path),  # not the current directory
    )
    with pytest.raises(OSError):
        await manager.start_kernel(kernel_name="broken", kernel_id="failed-start")
    assert "failed-start" in manager._pending_kernels  # upstream fixed this: drop the workaround
    forget_pending_kernel(manager, "failed-start")
    assert "failed-start" not in manager._pending_kernels
    forget_pending_kernel(object(), "anything")  # another manager: nothing to do, no error


def test_jupyter_server_still_keeps_open_kernel_websockets_privately() -> None:
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    assert isinstance(ZMQChannelsWebsocketConnection._open_sessions, dict)
    assert open_kernel_websockets() is ZMQChannelsWebsocketConnection._open_sessions


def test_jupyter_server_still_watches_a_kernels_activity_on_one_iopub_socket_made_at_its_start() -> None:
    """The reason for watch_new_kernel_activity: only jupyter_server's own restart re-watches."""
    import inspect

    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

    assert "_activity_stream" in inspect.getsource(MappingKernelManager.start_watching_activity)
    assert "start_watching_activity" in inspect.getsource(MappingKernelManager._async_restart_kernel)

    class Stream:
        def __init__(self) -> None:
            self.socket = type("Socket", (), {"closed": False})()

        def close(self) -> None:
            self.socket.closed = True

    class Manager:
        def __init__(self) -> None:
            self.old = Stream()
            self._kernels = {
                "k": type("Kernel", (), {"_activity_stream": self.old, "execution_state": "busy"})()
            }
            self.watched: list[str] = []

        def start_watching_activity(self, kernel_id: str) -> None:
            self.watched.append(kernel_id)

    manager = Manager()
    assert watch_new_kernel_activity(manager, "k")
    assert manager.old.socket.closed and manager.watched == ["k"]
    assert manager._kernels["k"].execution_state == "starting"
    assert not watch_new_kernel_activity(manager, "unknown") and manager.watched == ["k"]
    assert not watch_new_kernel_activity(object(), "k")  # another manager: nothing to do


def test_tornado_still_escapes_percent_in_log_message_and_ours_does_not() -> None:
    plain = HTTPError(409, log_message="50% does not fit")
    assert plain.log_message == "50%% does not fit"  # upstream changed: ExactLogMessage may go
    refusal = answerable(DoesNotFitError("50% does not fit: 2G free on GPU0"))
    assert isinstance(refusal, HTTPError) and isinstance(refusal, DoesNotFitError)
    assert (refusal.status_code, refusal.log_message) == (409, "50% does not fit: 2G free on GPU0")
    assert str(refusal) == "50% does not fit: 2G free on GPU0"


def test_an_answerable_refusal_pickles_as_the_plain_error() -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(answerable(DoesNotFitError("no room"))))
    assert type(copy) is DoesNotFitError and str(copy) == "no room"


def test_tornado_websockets_still_keep_their_stream_on_the_connection() -> None:
    """close_websocket_now drops ``handler.ws_connection.stream``; tornado must still have it."""
    import inspect

    from tornado.websocket import WebSocketProtocol

    assert "self.stream" in inspect.getsource(WebSocketProtocol.__init__)


async def test_jupyter_server_still_fails_to_shut_down_a_pending_kernel() -> None:
    """The reason the server settles its starts before ``shutdown_all`` (server.lifecycle): a
    start still pending is asked to shut down like a running kernel, and answers 404."""
    import asyncio

    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_gpushare.compat import pending_kernel_starts

    manager = AsyncMappingKernelManager()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    manager._pending_kernels["waiting"] = never
    assert pending_kernel_starts(manager) == {"waiting": never}
    with pytest.raises(HTTPError) as raised:
        await manager.shutdown_all()
    assert raised.value.status_code == 404  # upstream fixed this: settling may go
    assert pending_kernel_starts(object()) == {}


class _Restarting:
    """A kernel manager whose restart waits for its new pod: ``ready`` is the restart's start.
    Its provisioner abandons that start as KubernetesProvisioner.abandon_launch does."""

    def __init__(self) -> None:
        import asyncio

        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.restarter_stopped = False
        outer = self

        class Provisioner:
            def abandon_launch(self) -> bool:
                outer._ready.set_exception(RuntimeError("the kernel was shut down while its pod waited"))
                return True

        self.provisioner = Provisioner()

    @property
    def ready(self) -> object:
        return self._ready

    def stop_restarter(self) -> None:
        self.restarter_stopped = True


async def test_jupyter_client_still_fails_a_shutdown_during_a_restart() -> None:
    """The reason for shutdown_stops_restarts: jupyter_client asks ``km.ready.exception()`` of a
    kernel whose restart has not finished, which raises; with the wrapper the restart is
    abandoned and the kernel removed."""
    import asyncio

    from jupyter_gpushare.compat import shutdown_stops_restarts

    manager = AsyncMultiKernelManager()
    restarting = _Restarting()
    manager._kernels["k"] = restarting
    with pytest.raises(asyncio.InvalidStateError):  # upstream fixed this: the wrapper may go
        await manager.shutdown_kernel("k")
    assert shutdown_stops_restarts(manager)
    assert not shutdown_stops_restarts(manager)  # once per manager
    await manager.shutdown_kernel("k")
    assert restarting.restarter_stopped and "k" not in manager._kernels
    assert not shutdown_stops_restarts(object())  # another manager: nothing to wrap
