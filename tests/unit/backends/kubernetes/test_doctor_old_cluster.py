"""``doctor`` with a DRA preset on a cluster that serves no ``resource.k8s.io`` API (Kubernetes
before 1.32, or the API turned off): one canned answer from kmock's API server, since the test
cluster (tests/cluster/, Kubernetes 1.34 and later) always serves ``resource.k8s.io/v1``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest
import yaml

from jupyter_gpushare.backends.kubernetes.cluster.clients import forget_shared_clusters
from jupyter_gpushare.cli import main

NODES = kmock.resource("", "v1", "nodes")


@pytest.fixture
def old_cluster(tmp_path: Path) -> Iterator[Path]:
    """kmock's Kubernetes API on loopback (no resource.k8s.io group) and a kubeconfig for it."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    url: list[str] = []

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as api:
            api.resources[NODES] = {"kind": "Node", "namespaced": False, "verbs": ["list"]}
            # The official client asks for the API groups with a trailing slash.
            api["get /apis/"] << {"apiVersion": "v1", "kind": "APIGroupList", "groups": []}
            async with kmock.Server(api) as server:
                url.append(str(server.url).rstrip("/"))
                ready.set()
                await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30), "kmock's server did not start"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "old", "cluster": {"server": url[0]}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "old", "context": {"cluster": "old", "user": "tester"}}],
                "current-context": "old",
            }
        )
    )
    yield kubeconfig
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    loop.close()


def test_doctor_says_a_cluster_without_dra_cannot_serve_a_dra_preset(
    old_cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(old_cluster))
    monkeypatch.setenv("JUPYTER_GPUSHARE_BACKEND", "kubernetes")
    monkeypatch.setenv("JUPYTER_GPUSHARE_NAMESPACE", "kernels")
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "nvidia-dra")
    forget_shared_clusters()
    try:
        main(["doctor", "--json", "--no-kernel"])
    finally:
        forget_shared_clusters()
    found = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert found["DRA"]["status"] == "FAIL"
    assert found["DRA"]["detail"] == (
        "the cluster serves no resource.k8s.io API; preset 'nvidia-dra' needs resource.k8s.io/v1"
    )
    assert "Kubernetes 1.34" in found["DRA"]["fix"]
