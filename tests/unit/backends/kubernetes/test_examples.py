"""examples/kubernetes: the RBAC manifests validate and grant the backend exactly what it calls,
and the kernel image recipe installs what kernel pods need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.k8s_pods import (
    validate,
)

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "kubernetes"

# What the backend calls (jupyter_gpushare/backends/kubernetes/cluster/cluster.py and watch.py), per
# API group and resource: the Role grants this and nothing more.
BACKEND_CALLS = {
    ("", "pods"): {"create", "get", "list", "watch", "delete"},
    ("", "pods/log"): {"get"},
    ("", "secrets"): {"create", "list", "delete"},
    ("", "events"): {"list"},
    ("kueue.x-k8s.io", "workloads"): {"list"},  # Kueue's reason a kernel pod waits
    # Its place in Kueue's queue (the visibility API: Cluster.pending_workloads)
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads"): {"get"},
}


def rbac_documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()) if doc]


def test_the_example_rbac_manifests_validate() -> None:
    documents = rbac_documents()
    assert {doc["kind"] for doc in documents} == {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    for document in documents:
        validate(document)


def test_the_example_role_is_least_privilege() -> None:
    documents = rbac_documents()
    [role] = [doc for doc in documents if doc["kind"] == "Role"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        [group] = rule["apiGroups"]
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        for resource in rule["resources"]:
            granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == BACKEND_CALLS
    [cluster_role] = [doc for doc in documents if doc["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    # Bindings point at the server's ServiceAccount; kernel pods get one with no rights and no token.
    accounts = {
        (doc["metadata"]["namespace"], doc["metadata"]["name"]): doc
        for doc in documents
        if doc["kind"] == "ServiceAccount"
    }
    for binding in (doc for doc in documents if doc["kind"].endswith("Binding")):
        [subject] = binding["subjects"]
        assert (subject["namespace"], subject["name"]) in accounts
    kernel_account = accounts["jupyter-kernels", "jupyter-gpushare-kernel"]
    assert kernel_account["automountServiceAccountToken"] is False
    assert not any(
        subject["name"] == "jupyter-gpushare-kernel"
        for doc in documents
        if doc["kind"].endswith("Binding")
        for subject in doc["subjects"]
    )


def test_the_kernel_image_recipe_installs_what_kernel_pods_need() -> None:
    dockerfile = (EXAMPLES / "kernel-image" / "Dockerfile").read_text()
    assert '"ipykernel>=7.4"' in dockerfile  # reads CurveZMQ keys from the connection file
    assert "jupyter_gpushare-*.whl" in dockerfile  # the kernel side: --ext=jupyter_gpushare.kernel
    assert "zmq.has('curve')" in dockerfile
    assert "command -v cp" in dockerfile  # the init container copies the connection file with cp
    assert "USER 1000" in dockerfile


# What the broker calls in the kernels' namespace (backends/kubernetes/broker/: pods.py,
# pod_objects.py, orphans.py; kueue_reads.py; the watch): its Role grants this and nothing more.
BROKER_CALLS = {
    ("", "pods"): {"create", "list", "watch", "delete"},
    ("", "secrets"): {"create", "list", "delete"},
    ("", "events"): {"list"},  # Kueue's reason for a pod it preempted, once gone
    ("kueue.x-k8s.io", "workloads"): {"list"},  # Kueue's reason kernel pods wait
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads"): {"get"},  # and their places
    ("kueue.x-k8s.io", "localqueues"): {"get"},  # the ClusterQueue behind (the wait estimate)
}


def test_the_brokers_role_grants_what_the_broker_calls_and_no_more() -> None:
    documents = [doc for doc in yaml.safe_load_all((EXAMPLES / "broker-rbac.yaml").read_text()) if doc]
    for document in documents:
        validate(document)
    [role] = [doc for doc in documents if doc["kind"] == "Role"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        [group] = rule["apiGroups"]
        for resource in rule["resources"]:
            granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == BROKER_CALLS
    cluster_roles = {
        doc["metadata"]["name"]: doc["rules"] for doc in documents if doc["kind"] == "ClusterRole"
    }
    assert cluster_roles == {
        "jupyter-gpushare-broker-nodes": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
        ],
        # The quota behind the kernels' LocalQueue (Cluster.cluster_queue: the wait estimate).
        "jupyter-gpushare-broker-kueue": [
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["get"]}
        ],
    }
    bound = {doc["roleRef"]["name"] for doc in documents if doc["kind"] == "ClusterRoleBinding"}
    assert bound == set(cluster_roles)
