"""A real JupyterHub (configurable-http-proxy from npm, local spawner) with two users of
different GPU budgets sharing one node ledger (docs/admins/jupyterhub.md, team box without Kubernetes)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import GiB

from ..support.hermetic import isolated_from_the_machine
from ..support.hub import ADMIN_TOKEN, HUB_BASE, Hub, proxy_command
from ..support.nodes import BIN, Node
from ..support.servers import free_port

pytestmark = pytest.mark.integration

HUB_CONFIG = (
    HUB_BASE
    + """
from jupyter_gpushare.hub import budget_environment
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{root}/home/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root", "--ServerApp.log_level=INFO"]
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.Spawner.environment = {environment!r}
c.JupyterHub.services = [{{"name": "tests", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "tests",
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "read:users"],
    "services": ["tests"],
}}]

def pre_spawn_hook(spawner):
    spawner.environment.update(budget_environment(spawner.user_options, {ledger!r}))

c.Spawner.pre_spawn_hook = pre_spawn_hook
"""
)


@pytest.fixture
def hub(node: Node) -> Iterator[Hub]:
    root = node.root / "hub"
    (root / "home").mkdir(parents=True)
    environment = {
        name: node.env[name]
        for name in ("JUPYTER_PATH", "JUPYTER_GPUSHARE_SIMULATE", "JUPYTER_GPUSHARE_LEDGER_PATH")
    }
    environment["JUPYTER_GPUSHARE_SAMPLE_INTERVAL"] = "0.5"
    environment |= isolated_from_the_machine()  # a spawner passes only what it is given
    port = free_port()
    config = root / "jupyterhub_config.py"
    config.write_text(
        HUB_CONFIG.format(
            port=port,
            hub_port=free_port(),
            proxy_api_port=free_port(),
            proxy=proxy_command(),
            root=root,
            singleuser=str(BIN / "jupyterhub-singleuser"),
            environment=environment,
            token=ADMIN_TOKEN,
            ledger=node.env["JUPYTER_GPUSHARE_LEDGER_PATH"],
        )
    )
    log = root / "hub.log"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(config)],
        cwd=root,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    running = Hub(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"jupyterhub exited:\n{log.read_text()[-4000:]}")
        try:
            if running.call("GET", "/hub/api/")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"jupyterhub did not answer:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)
    try:
        yield running
    finally:
        for user in ("alice", "bob"):
            with contextlib.suppress(OSError):
                running.call("DELETE", f"/hub/api/users/{user}/server")
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(hub: Hub, user: str, budget: str) -> str:
    """Create the user, spawn their server with a GPU budget, and return a token for them."""
    assert hub.call("POST", f"/hub/api/users/{user}")[0] in (201, 409)
    status, body = hub.call("POST", f"/hub/api/users/{user}/server", {"gpu_budget": budget})
    assert status in (201, 202), body
    deadline = time.monotonic() + 120
    while True:
        _, model = hub.call("GET", f"/hub/api/users/{user}")
        server = (model.get("servers") or {}).get("")
        if server and server.get("ready"):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{user}'s server did not start:\n{hub.log.read_text()[-4000:]}")
        time.sleep(0.5)
    status, token = hub.call("POST", f"/hub/api/users/{user}/tokens", {"note": "gpushare test"})
    assert status in (200, 201), token
    return str(token["token"])


def test_two_users_of_different_budgets_share_one_ledger(node: Node, hub: Hub) -> None:
    alice = start_server(hub, "alice", "8G")
    bob = start_server(hub, "bob", "4G")
    api = "/api/gpushare"

    def start(user: str, token: str) -> tuple[int, Any]:
        return hub.call("POST", f"/user/{user}{api}/kernels", {"name": "python3-gpu-4g"}, token=token)

    first, second, third = start("alice", alice), start("alice", alice), start("alice", alice)
    assert (first[0], second[0]) == (201, 201), (first, second)
    assert third[0] == 409 and "above the per-user limit of 8G" in third[1]["message"], third
    bobs, bobs_second = start("bob", bob), start("bob", bob)
    assert bobs[0] == 201, bobs
    assert bobs_second[0] == 409 and "per-user limit of 4G" in bobs_second[1]["message"]

    # One node ledger holds both users' slices.
    owners = sorted(record.owner for record in node.running())
    assert owners == ["alice", "alice", "bob"]
    assert node.reserved() == 12 * GiB

    # Each sees their own kernels in detail and the other's only as reserved memory.
    alice_kernels = hub.call("GET", f"/user/alice{api}/kernels", token=alice)[1]
    assert {kernel["owner"] for kernel in alice_kernels} == {"alice"} and len(alice_kernels) == 2
    pool = hub.call("GET", f"/user/alice{api}/pool", token=alice)[1]
    assert pool["devices"][0]["memory_reserved"] == 12 * GiB
    assert bobs[1]["kernel_id"] not in json.dumps(pool) + json.dumps(alice_kernels)
    # Neither can act on the other's slice, nor reach the other's server.
    bob_kernel = bobs[1]["kernel_id"]
    assert hub.call("DELETE", f"/user/alice{api}/kernels/{bob_kernel}/gpu", token=alice)[0] == 404
    assert hub.call("GET", f"/user/bob{api}/kernels", token=alice)[0] in (302, 403, 404)
    record = node.ledger.get(bob_kernel)
    assert record is not None and record.owner == "bob"
