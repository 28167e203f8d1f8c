"""``POST pods`` through the broker: a start that fits is admitted as it comes and answered once
its pod is created — or, when the API server is slow to create it, answered as it stands after
``ANSWER_WITHIN`` seconds, its creation going on and its outcome told by the caller's next ask.

The broker's own parts are real (its ``KubernetesBackend`` and the process's ``SharedCluster``,
without a watch: they list through the API client); the API client is the edge substituted here
(a test cluster is in the integration tests): a stand-in whose pod creation waits until the test
lets it go, or fails."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
from jupyter_gpushare.backends.kubernetes.broker import pods as pod_starts
from jupyter_gpushare.backends.kubernetes.broker.pod_objects import PodAsk
from jupyter_gpushare.backends.kubernetes.broker.pods import PodStarts
from jupyter_gpushare.backends.kubernetes.cluster import clients
from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name, secret_name
from jupyter_gpushare.backends.kubernetes.objects.starting import CREATED, KernelPodStartError
from jupyter_gpushare.config import GPUShare

from .test_pool import node

NAMESPACE = "kernels"
HAMI_NODE = node(
    "gpu-1",
    {"nvidia.com/gpu": "10", "nvidia.com/gpumem": "81920", "nvidia.com/gpucores": "100"},
    {"nvidia.com/gpu.product": "NVIDIA-H100"},
)


@dataclass
class SlowApi:
    """The Kubernetes API as the broker's client reaches it: one GPU node, no kernel pod yet;
    pod creation waits for ``go`` (and then fails with ``refuse``)."""

    namespace: str = NAMESPACE
    go: threading.Event = field(default_factory=threading.Event)
    refuse: bool = False
    made: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def list_nodes(self) -> list[dict[str, Any]]:
        return [HAMI_NODE]

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        return []

    def read_pod(self, name: str) -> None:
        return None

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

    def close(self) -> None:
        return None


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowApi]:
    """The stand-in as this process's client of the namespace; the machine's kubeconfig never
    consulted (KUBECONFIG names a file that is not there)."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    stand_in = SlowApi()
    key = (os.environ["KUBECONFIG"], NAMESPACE, os.getpid())
    clients._shared[key] = clients.SharedCluster(stand_in)  # type: ignore[arg-type]
    yield stand_in
    stand_in.go.set()  # a creation still waiting ends
    clients._shared.pop(key, None)


def ask(kernel_id: str) -> PodAsk:
    return PodAsk(kernel_id, "2G", "vgpu", None, ("sleep", "600"), {}, "python3", None, "t" * 32, 0)


def starts() -> PodStarts:
    return PodStarts(
        KubernetesBackend(GPUShare(backend="kubernetes", resource_preset="hami", namespace=NAMESPACE))
    )


def test_a_start_that_fits_is_answered_once_its_pod_is_created(api: SlowApi) -> None:
    api.go.set()
    view = asyncio.run(starts().run_start("alice", "alice@s", ask("k1")))
    assert (view["state"], view["detail"]) == ("starting", CREATED)
    assert api.made == [secret_name("k1"), pod_name("k1")]  # both there when it was answered


def test_an_api_server_slow_to_create_gets_its_caller_an_answer_in_time(
    api: SlowApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pod_starts, "ANSWER_WITHIN", 0.5)
    pods = starts()

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
    api: SlowApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pod_starts, "ANSWER_WITHIN", 0.3)
    api.refuse = True
    pods = starts()
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


def test_a_start_that_waits_for_a_creator_thread_is_answered_once_queued(
    api: SlowApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every creator thread busy for longer than ``ANSWER_WITHIN``: the waiting start is not
    answered before it is queued (there would be nothing to say of it), but once it is."""
    monkeypatch.setattr(pod_starts, "ANSWER_WITHIN", 0.3)
    pods = starts()
    pods._creators = ThreadPoolExecutor(max_workers=1)  # k1's creation holds the only one
    held_for = 1.0

    async def post_both() -> tuple[dict[str, Any], dict[str, Any], float]:
        first = asyncio.ensure_future(pods.run_start("alice", "alice@s", ask("k1")))
        began = time.monotonic()
        second = asyncio.ensure_future(pods.run_start("alice", "alice@s", ask("k2")))
        await asyncio.sleep(held_for)
        assert not second.done(), "answered before it was queued"
        api.go.set()
        return await first, await second, time.monotonic() - began

    first, second, took = asyncio.run(post_both())
    assert first["detail"] == "creating the kernel pod", first  # answered after ANSWER_WITHIN
    assert second["state"] == "starting" and took >= held_for, (second, took)
    assert pod_name("k2") in api.made


def test_a_change_nobody_asks_about_costs_no_wake_up_of_the_event_loop(api: SlowApi) -> None:
    """A start just created is told to the asks about it; with none (its caller's answer is
    still to come), the creator's thread hands the event loop nothing."""
    pods = starts()
    handed: list[tuple[Any, ...]] = []

    class Loop:  # the event loop as the creators' threads reach it
        def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
            handed.append(args)

    pods._wake = (Loop(), asyncio.Event())  # type: ignore[assignment]
    pods._tell(["k1"])
    assert handed == []
    pods.ask("k2")
    pods._tell(["k1", "k2"])
    assert handed == [(["k2"],)]
