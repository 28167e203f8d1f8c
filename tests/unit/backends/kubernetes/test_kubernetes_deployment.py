"""The Kubernetes deployment as docs/admins/kubernetes.md gives it, checked without a cluster
(issue 25): the steps' files exist and validate, they apply in the page's order on a fresh
cluster (every namespaced object's namespace made before it), the names agree across files
(namespaces, accounts, images, labels, ports), the values files parse and set real traits, and
the images have what the docs say. Running the commands on Kubernetes' own control plane is
left to the cluster tests.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown_it import MarkdownIt

from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    APP,
    APP_LABEL,
    KERNEL_FS_GROUP,
    kernel_ports,
)
from jupyter_gpushare.config import GPUShare
from tests.support.k8s_pods import build, validate

ROOT = Path(__file__).resolve().parents[4]
PAGE = ROOT / "docs" / "admins" / "kubernetes.md"
SECTION = "Zero to JupyterHub, step by step"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
FRESH = {"default", "kube-system", "kube-public"}


def commands() -> list[list[str]]:
    """The shell commands of the page's step-by-step section, in order."""
    tokens = MarkdownIt("commonmark").parse(PAGE.read_text(encoding="utf-8"))
    found, inside = [], False
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            inside = token.tag == "h2" and tokens[index + 1].content == SECTION
        elif inside and token.type == "fence" and token.info == "bash":
            text = token.content.replace("\\\n", " ")
            found.extend(shlex.split(line, comments=True) for line in text.splitlines() if line.strip())
    return [command for command in found if command]


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def helm_values(command: list[str]) -> list[dict[str, Any]]:
    return [yaml.safe_load((ROOT / command[i + 1]).read_text()) for i, w in enumerate(command) if w == "-f"]


def test_the_steps_apply_in_order_on_a_fresh_cluster() -> None:
    """Every namespaced object goes into a namespace that exists by then: made earlier in the
    same file, by an earlier file, or by helm for its release. Failed before: rbac.yaml put a
    ServiceAccount in `jupyter`, which nothing made; rbac-dra.yaml bound a Role in `jhub`."""
    existing = set(FRESH)
    applied = []
    for command in commands():
        if command[:2] == ["kubectl", "apply"]:
            for path in (ROOT / command[i + 1] for i, w in enumerate(command) if w == "-f"):
                applied.append(path.name)
                for document in documents(path):
                    validate(document)
                    if document["kind"] == "Namespace":
                        existing.add(document["metadata"]["name"])
                    elif document["kind"] not in CLUSTER_SCOPED:
                        namespace = document["metadata"]["namespace"]
                        assert namespace in existing, f"{path.name}: {document['kind']} in {namespace!r}"
        elif command[:2] == ["helm", "upgrade"]:
            namespace = command[command.index("-n") + 1]
            assert namespace in existing or "--create-namespace" in command, command
            existing.add(namespace)
            assert helm_values(command), command
    assert applied[:3] == ["rbac.yaml", "rbac-dra.yaml", "networkpolicy-kernels.yaml"]
    assert {"jupyter", "jupyter-kernels"} <= existing


def test_the_broker_way_applies_on_a_fresh_cluster_too() -> None:
    existing = set(FRESH)
    for name in ("broker-rbac.yaml", "broker-rbac-dra.yaml", "networkpolicy-kernels.yaml"):
        for document in documents(ROOT / "examples" / "kubernetes" / name):
            validate(document)
            if document["kind"] == "Namespace":
                existing.add(document["metadata"]["name"])
            elif document["kind"] not in CLUSTER_SCOPED:
                assert document["metadata"]["namespace"] in existing, (name, document["metadata"])
    header = (ROOT / "examples" / "jupyterhub" / "z2jh-broker-values.yaml").read_text()
    assert "-n jupyter" in header and "--create-namespace" in header


def kernel_pod() -> dict[str, Any]:
    return build(GPUShare(resource_preset="hami"), mode="vgpu")


def values(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "examples" / "jupyterhub" / name).read_text()))


@pytest.mark.parametrize("name", ["z2jh-kernel-pods-values.yaml", "z2jh-broker-values.yaml"])
def test_the_servers_network_policy_reaches_kernel_pods_and_lets_them_call_back(name: str) -> None:
    """Failed before: no values for kernel pods without a broker, and none opened the chart's
    egress policy (private addresses blocked) to kernel pods' ports."""
    policy = values(name)["singleuser"]["networkPolicy"]
    pod = kernel_pod()
    labels = pod["metadata"]["labels"]
    first, last = min(kernel_ports(0).values()), max(kernel_ports(999).values())
    [to_kernels] = [rule for rule in policy["egress"] if 50001 in [p["port"] for p in rule["ports"]]]
    [peer] = to_kernels["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "jupyter-kernels"}
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()
    assert [(p["port"], p["endPort"]) for p in to_kernels["ports"]] == [(first, last)] == [(50001, 59995)]
    [call_back] = policy["ingress"]
    assert call_back["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    assert call_back["ports"] == [{"protocol": "TCP", "port": 8888}]


def test_the_kernels_network_policy_selects_kernel_pods_and_lets_servers_in() -> None:
    [policy] = documents(ROOT / "examples" / "kubernetes" / "networkpolicy-kernels.yaml")
    validate(policy)
    pod = kernel_pod()
    assert policy["spec"]["podSelector"]["matchLabels"] == {APP_LABEL: APP}
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [rule] = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"component": "singleuser-server"}
    assert rule["ports"] == [{"protocol": "TCP", "port": 50001, "endPort": 59995}]
    assert policy["metadata"]["namespace"] == "jupyter-kernels"


def test_the_kernel_pods_values_set_real_traits_and_accounts_that_exist() -> None:
    singleuser = values("z2jh-kernel-pods-values.yaml")["singleuser"]
    environment = singleuser["extraEnv"]
    traits = {name.removeprefix("JUPYTER_GPUSHARE_").lower(): value for name, value in environment.items()}
    assert set(traits) <= set(GPUShare.class_traits(config=True)), traits
    settings = GPUShare(**traits)
    assert settings.backend == "kubernetes"
    rbac = documents(ROOT / "examples" / "kubernetes" / "rbac.yaml")
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in rbac if d["kind"] == "ServiceAccount"
    }
    assert ("jupyter", singleuser["serviceAccountName"]) in accounts
    assert (settings.namespace, settings.service_account) in accounts
    [role] = [d for d in rbac if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == settings.namespace
    assert settings.kernel_image.startswith("registry.example.com/jupyter-gpushare-kernel:")


def from_image(dockerfile: str) -> str:
    [base] = re.findall(r"^ARG BASE=(\S+)$", dockerfile, re.MULTILINE)
    assert "FROM ${BASE}" in dockerfile
    return base


def test_the_images_have_what_the_docs_say() -> None:
    """Failed before: the docs suggested a single-user image built from the kernel image (no
    JupyterLab, no jupyterhub-singleuser) and a hub image with no recipe. They cannot be built
    here (no container engine): their recipes are read."""
    images = ROOT / "examples" / "kubernetes"
    singleuser = (images / "singleuser-image" / "Dockerfile").read_text()
    assert from_image(singleuser).startswith("quay.io/jupyter/base-notebook:")  # JupyterLab, the hub's
    assert "command -v jupyterhub-singleuser" in singleuser
    assert "jupyter gpushare kernelspec install --sys-prefix" in singleuser
    assert 'grep -q "jupyter-gpushare.*enabled"' in singleuser  # the panel and the picker
    assert "jupyter_gpushare-*.whl" in singleuser and '"ipykernel>=7.4"' in singleuser
    hub = (images / "hub-image" / "Dockerfile").read_text()
    base = from_image(hub)
    assert base.startswith("quay.io/jupyterhub/k8s-hub:")
    assert "jupyter-gpushare broker --help" in hub
    # The values name the images these recipes build, the hub's at the chart's version.
    broker_values = values("z2jh-broker-values.yaml")
    assert broker_values["hub"]["image"]["tag"] == base.rsplit(":", 1)[1]
    assert f"-t {broker_values['hub']['image']['name']}:{broker_values['hub']['image']['tag']}" in hub
    for name in ("z2jh-broker-values.yaml", "z2jh-kernel-pods-values.yaml"):
        image = values(name)["singleuser"]["image"]
        assert f"-t {image['name']}:{image['tag']}" in singleuser, name
    for command in commands():
        if command[:2] == ["helm", "upgrade"]:
            assert command[command.index("--version") + 1] == base.rsplit(":", 1)[1]
    # The kernel image runs as the group every kernel pod gives its Secret to.
    assert "USER 1000:100" in (images / "kernel-image" / "Dockerfile").read_text()
    assert kernel_pod()["spec"]["securityContext"]["fsGroup"] == KERNEL_FS_GROUP == 100
    page = PAGE.read_text()
    for recipe in ("singleuser-image", "hub-image", "kernel-image"):
        assert f"examples/kubernetes/{recipe}" in page


def test_the_page_ends_with_a_test_kernel_and_its_pod() -> None:
    steps = commands()
    assert ["jupyter", "gpushare", "doctor"] in steps
    [watch] = [command for command in steps if command[:3] == ["kubectl", "get", "pods"]]
    assert watch[watch.index("-n") + 1] == "jupyter-kernels"
    assert watch[watch.index("-l") + 1] == f"{APP_LABEL}={APP}"
