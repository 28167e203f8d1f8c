"""``POST pods`` through the broker: a start that fits is admitted as it comes and answered once
its pod is created — or, when the API server is slow to create it, answered as it stands after
``ANSWER_WITHIN`` seconds, its creation going on and its outcome told by the caller's next ask.

The cluster's API is the edge substituted here (a test cluster is in the integration tests):
a stand-in whose pod creation waits until the test lets it go, or fails."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.broker import pods as pod_starts
from jupyter_gpushare.backends.kubernetes.broker.pod_objects import PodAsk
from jupyter_gpushare.backends.kubernetes.broker.pods import PodStarts
from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts
from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name, secret_name
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.backends.kubernetes.objects.starting import CREATED, KernelPodStartError
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.sizes import GiB

SETTINGS = GPUShare(backend="kubernetes", resource_preset="hami", namespace="kernels")
NODE = NodeGPUs("gpu-1", "NVIDIA-H100", 80 * GiB, 1, None, None, 80 * GiB, {"nvidia.com/gpumem": "81920"})


@dataclass
class SlowApi:
    """The API server as the broker's client reaches it: pod creation waits for ``go``."""

    namespace: str = "kernels"
    go: threading.Event = field(default_factory=threading.Event)
    refuse: bool = False
    made: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def create_secret(self, body: dict[str, Any]) -> None:
        self.made.append(body["metadata"]["name"])

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.go.wait(30)
        if self.refuse:
            raise ClusterError("the API server refused the pod: admission webhook said no", 400)
        self.made.append(body["metadata"]["name"])
        return {**body, "metadata": {**body["metadata"], "uid": "u1"}}

    def delete_pod(self, name: str, grace_period_seconds: int | None = None) -> None:
        self.deleted.append(name)

    def delete_secret(self, name: str) -> None:
        self.deleted.append(name)


@dataclass
class Backend:
    """What the starts read of the cluster (nothing created shows in the watch here)."""

    cluster: SlowApi
    settings: GPUShare = SETTINGS
    preset: Any = field(default_factory=lambda: resolve_preset("hami"))
    holder: str = "broker@test"

    def facts(self) -> Any:
        return cluster_facts(self.settings)

    def nodes(self) -> list[NodeGPUs]:
        return [NODE]

    def slices(self) -> list[Any]:
        return []

    def pod_object(self, name: str) -> None:
        return None

    def change_marker_at_once(self) -> int:
        return 1


def ask(kernel_id: str) -> PodAsk:
    return PodAsk(kernel_id, "2G", "vgpu", None, ("sleep", "600"), {}, "python3", None, "t" * 32, 0)


def starts(api: SlowApi) -> PodStarts:
    return PodStarts(Backend(api))  # type: ignore[arg-type]


def test_a_start_that_fits_is_answered_once_its_pod_is_created() -> None:
    api = SlowApi()
    api.go.set()
    view = asyncio.run(starts(api).run_start("alice", "alice@s", ask("k1")))
    assert (view["state"], view["detail"]) == ("starting", CREATED)
    assert api.made == [secret_name("k1"), pod_name("k1")]  # both there when it was answered


def test_an_api_server_slow_to_create_gets_its_caller_an_answer_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_starts, "ANSWER_WITHIN", 0.5)
    api = SlowApi()
    pods = starts(api)

    async def post() -> tuple[dict[str, Any], float]:
        began = time.monotonic()
        view = await pods.run_start("alice", "alice@s", ask("k1"))
        return view, time.monotonic() - began

    view, took = asyncio.run(post())
    # Answered as it stands, its pod still being made; not after the creation.
    assert (view["state"], view["detail"]) == ("starting", "creating the kernel pod"), view
    assert 0.5 <= took < 10 and not api.go.is_set()
    api.go.set()
    deadline = time.monotonic() + 30
    while pods.view("alice", "k1")["detail"] != CREATED:
        assert time.monotonic() < deadline, "the creation did not go on after the answer"
        time.sleep(0.05)


def test_a_creation_that_fails_after_the_answer_is_told_by_the_next_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_starts, "ANSWER_WITHIN", 0.3)
    api = SlowApi(refuse=True)
    pods = starts(api)
    view = asyncio.run(pods.run_start("alice", "alice@s", ask("k1")))
    assert view["detail"] == "creating the kernel pod", view
    api.go.set()
    deadline = time.monotonic() + 30
    while True:
        try:
            pods.view("alice", "k1")
        except KernelPodStartError as error:
            assert "admission webhook said no" in str(error)
            break
        assert time.monotonic() < deadline, "the failed creation was never told"
        time.sleep(0.05)
    assert {secret_name("k1"), pod_name("k1")} <= set(api.deleted)  # what was made of it is deleted
