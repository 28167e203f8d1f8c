"""A real JupyterHub for tests: the lines every test hub's config shares, how to reach it, and
configurable-http-proxy from npm (``make test`` installs it into build/node)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .json_http import json_call

ROOT = Path(__file__).parents[2]
ADMIN_TOKEN = "gpushare-test-admin-token"

# Every test hub: on loopback, its state in {root}, anyone may log in (the dummy authenticator).
# A test's own config adds its spawner, services and roles; its fields are str.format's.
HUB_BASE = """
c = get_config()
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///{root}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{root}/cookie_secret"
c.JupyterHub.pid_file = "{root}/hub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
"""


def proxy_command() -> str:
    # `make test` installs it with npm into build/node; an installed one on PATH works too.
    local = ROOT / "build" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    found = str(local) if local.exists() else shutil.which("configurable-http-proxy")
    if not found:
        pytest.fail(
            "configurable-http-proxy is missing: run `make install` (npm install --prefix build/node "
            "configurable-http-proxy@4)"
        )
    return found


@dataclass
class Hub:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def call(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
        headers = {"Authorization": f"token {token}"}
        return json_call(f"{self.url}{path}", method, body, headers=headers, timeout=120)
