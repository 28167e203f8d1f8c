"""A real ``jupyter server`` process for tests, talked to over HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .json_http import json_call
from .nodes import BIN, Node
from .polling import async_wait_until


def free_port(ip: str = "127.0.0.1") -> int:
    """A port free on ``ip`` now (another process may take it before it is used: a server
    started on it fails at once, saying so, and its caller may try another)."""
    with socket.socket() as probe:
        probe.bind((ip, 0))
        return int(probe.getsockname()[1])


PORT_IN_USE = "is already in use"  # jupyter_server's sentence for a port another process holds


@dataclass
class Response:
    status: int
    body: Any


@dataclass
class JupyterServer:
    process: subprocess.Popen[bytes]
    url: str
    token: str
    log_path: Path
    _closed: bool = field(default=False)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 120,
        *,
        raw: bytes | None = None,
        token: str | bool | None = True,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One HTTP call; ``token=None`` sends no credentials, a string sends that token."""
        headers = dict(headers or {})
        if token is True:
            headers["Authorization"] = f"token {self.token}"
        elif isinstance(token, str):
            headers["Authorization"] = f"token {token}"
        status, answer = json_call(
            f"{self.url}{path}", method, body, headers=headers, raw=raw, timeout=timeout
        )
        return Response(status, answer)

    def stop(self, timeout: float = 30) -> None:
        if self._closed:
            return
        self._closed = True
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    node: Node,
    name: str = "server",
    extra_env: dict[str, str] | None = None,
    as_user: tuple[int, int] | None = None,
    *,
    ip: str = "127.0.0.1",
    port: int | None = None,
) -> JupyterServer:
    """A server on ``node``; ``as_user`` (uid, gid) runs it as that OS user (the caller is root).
    ``ip``: the address it listens on (a real node's pods reach the host at its own)."""
    port = port or free_port(ip)
    token = f"token-{name}"
    root = node.root / f"{name}-root"
    root.mkdir(exist_ok=True)
    log_path = node.root / f"{name}.log"
    env = dict(node.env, **(extra_env or {}))
    process = subprocess.Popen(
        [
            str(BIN / "jupyter-server"),
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",  # not another port: the caller waits on this one
            f"--ServerApp.ip={ip}",
            f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
            "--ServerApp.allow_root=True",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        **({"user": as_user[0], "group": as_user[1], "extra_groups": []} if as_user else {}),
    )
    server = JupyterServer(process, f"http://{ip}:{port}", token, log_path)
    try:
        return wait_ready(server, 60)
    except RuntimeError:
        server.stop()
        raise


def wait_ready(server: JupyterServer, timeout: float = 90) -> JupyterServer:
    """``server`` once it answers ``GET /api/status``; fails with its log if it exits first or
    does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"jupyter server exited:\n{server.log()}")
        try:
            if server.request("GET", "/api/status", timeout=2).status == 200:
                return server
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"jupyter server did not answer in {timeout:g} s:\n{server.log()}")


async def execute(server: JupyterServer, kernel_id: str, code: str, timeout: float = 60) -> tuple[str, str]:
    """Run ``code`` in the server's kernel over its websocket, as the browser does."""
    url = f"{server.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels"
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    # The token in a header: a JupyterHub single-user server takes none in a websocket's URL.
    connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"}))
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test"}
    header |= {"session": uuid.uuid4().hex, "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "allow_stdin": False}
    connection.write_message(
        json.dumps(
            {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
        )
    )
    out, err, replied, idle = "", "", False, False
    deadline = time.monotonic() + timeout
    try:
        while not (replied and idle):
            assert time.monotonic() < deadline, f"no reply to {code!r}: {server.log()[-2000:]}"
            message = json.loads(await asyncio.wait_for(connection.read_message(), timeout))  # type: ignore[arg-type]
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind == "stream":
                if message["content"]["name"] == "stdout":
                    out += message["content"]["text"]
                else:
                    err += message["content"]["text"]
            elif kind in ("execute_result", "display_data"):
                out += message["content"]["data"].get("text/plain", "") + "\n"
            elif kind == "error":
                err += "\n".join(message["content"]["traceback"])
            elif kind == "execute_reply":
                replied = True
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                idle = True
    finally:
        connection.close()

    # The server follows a kernel's state on its own subscription to the kernel's output, which
    # can trail this websocket's under load: a suspend right after the cell was refused as "runs a
    # cell" (a loaded run). What a test does next is meant for a kernel the server sees idle.
    def server_sees() -> object:
        model = server.request("GET", f"/api/kernels/{kernel_id}").body
        return model.get("execution_state") if isinstance(model, dict) else model  # gone: its answer

    await async_wait_until(
        server_sees,
        timeout,
        message=f"the server seeing kernel {kernel_id} idle after the cell",
        until=lambda state: state != "busy",
    )
    return out, err
