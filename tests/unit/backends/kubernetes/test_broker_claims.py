"""The broker under Dynamic Resource Allocation (pure parts): each start's pod has a claim of its
own name per generation, and a claim the scheduler cannot allocate fails the start with what it
asked for and the scheduler's words; the broker's DRA RBAC example. End to end:
tests/integration/test_broker_dra.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kubernetes_validate.utils import latest_version

from jupyter_gpushare.backends.kubernetes.broker.pods import PodStartState
from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_claim, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.claims import summary
from jupyter_gpushare.backends.kubernetes.objects.manifests import claim_name
from jupyter_gpushare.backends.kubernetes.objects.starting import progress
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import DoesNotFitError
from jupyter_gpushare.core.slice_request import make_slice_request


def start_of(preset: str, generation: int) -> PodStartState:
    settings = GPUShare(backend="kubernetes", resource_preset=preset)
    request = make_slice_request(
        "6G", "mps" if preset == "nvidia-dra" else "vgpu", None, "1G", "vgpu", settings.min_memory_bytes()
    )
    pod, pod_request = kernel_pod(
        settings,
        kernel_id="k1",
        server_id="alice@host",
        owner="alice",
        request=request,
        cluster=cluster_facts(settings),
        generation=generation,
    )
    return PodStartState(
        "k1", "alice", "alice@host", pod_request.memory, {}, pod, pod_request, "6G", generation
    )


def test_each_generation_of_a_kernel_pod_refers_to_a_claim_of_its_own() -> None:
    for generation in (0, 3):
        start = start_of("nvidia-dra", generation)
        assert start.claim == claim_name("k1", generation)
        assert start.pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": claim_name("k1", generation)}
        ]
        assert start.pod_request is not None
        claim = kernel_claim(
            start.pod_request,
            kernel_id="k1",
            server_id="alice@host",
            owner="alice",
            namespace="ns",
            size=start.size,
            generation=generation,
            pod={"name": "gpushare-kernel-k1", "uid": "u1"},
        )
        assert claim is not None and claim["metadata"]["name"] == start.claim
        assert claim["metadata"]["ownerReferences"][0]["uid"] == "u1"
    # A device-plugin preset makes no claim.
    assert start_of("hami", 0).claim is None


def test_an_unallocatable_claim_fails_with_what_it_asked_for_and_the_schedulers_words() -> None:
    start = start_of("nvidia-dra", 0)
    assert start.pod_request is not None
    pod: dict[str, Any] = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 cannot allocate all claims.",
                }
            ],
        },
    }
    times = {"waited": 12.0, "unschedulable_grace": 10.0, "launch_timeout": 300.0}
    asked = summary(start.pod_request)
    waiting = progress(pod, "p", unschedulable_for=1.0, asked=asked, **times)
    assert waiting.detail == "pending: 0/4 nodes are available: 4 cannot allocate all claims."
    failed = progress(pod, "p", unschedulable_for=10.0, asked=asked, **times)
    assert isinstance(failed.error, DoesNotFitError)
    assert str(failed.error) == (
        f"the cluster cannot place the kernel pod p (asked for {asked}): "
        "0/4 nodes are available: 4 cannot allocate all claims."
    )
    assert asked.startswith("a ResourceClaim for 1 gpu.nvidia.com device")


def test_the_brokers_dra_rbac_example_grants_what_its_dra_calls_need_and_no_more() -> None:
    path = Path(__file__).resolve().parents[4] / "examples" / "kubernetes" / "broker-rbac-dra.yaml"
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for document in documents:
        kubernetes_validate.validate(document, latest_version(), strict=True)
    granted: dict[tuple[str, str], set[str]] = {}
    for role in (doc for doc in documents if doc["kind"] in ("Role", "ClusterRole")):
        where = role["metadata"].get("namespace", "cluster")
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["resource.k8s.io"]
            for resource in rule["resources"]:
                granted.setdefault((where, resource), set()).update(rule["verbs"])
    assert granted == {
        # backends/kubernetes/broker/: create_claim, list_claims, delete_claim (with the pod, orphans)
        ("jupyter-kernels", "resourceclaims"): {"create", "list", "delete"},
        # k8s/watch.py with dra=True: the pool, admission, the fallback a claim got
        ("cluster", "resourceslices"): {"list", "watch"},
        ("cluster", "resourceclaims"): {"list", "watch"},
        ("cluster", "deviceclasses"): {"list", "watch"},
    }
    bindings = [doc for doc in documents if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {(s["name"], s["namespace"]) for b in bindings for s in b["subjects"]} == {("hub", "jupyter")}
