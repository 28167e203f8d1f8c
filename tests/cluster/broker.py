"""The GPU broker on the test cluster as benchmarks and tests start it: ``jupyter gpushare broker
--backend kubernetes`` on a Unix socket (no hub needed to identify its callers), its log in the
directory it is given."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError

BIN = Path(sys.executable).parent


def start_broker(root: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], BrokerClient]:
    """The broker with ``env`` (its kubeconfig, settings), on ``root/broker.sock``, once its
    watch has listed the cluster; its output in ``root/broker.log``."""
    socket = root / "broker.sock"
    broker = subprocess.Popen(
        [str(BIN / "jupyter-gpushare"), "broker", "--backend", "kubernetes", "--socket", str(socket)],
        env=env,
        stdout=(root / "broker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    client = BrokerClient(f"unix:{socket}")
    deadline = time.monotonic() + 60
    while True:
        try:
            client.call("GET", "info")
            client.call("GET", "pool")  # the watch's first listing is in
            return broker, client
        except UnreachableError:
            if broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((root / "broker.log").read_text()) from None
            time.sleep(0.05)


__all__ = ["start_broker"]
