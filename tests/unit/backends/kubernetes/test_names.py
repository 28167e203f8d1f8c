"""Names, labels and selectors of kernel pods and Secrets: valid for any owner and kernel id,
readable, distinct, and matched by the server's selector."""

from __future__ import annotations

import itertools
import re

import pytest

from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
from jupyter_gpushare.backends.kubernetes.objects.manifests import (
    label_value,
    make_secret,
    pod_name,
    secret_name,
    selector,
    server_label,
)
from tests.support.k8s_pods import (
    KERNEL_ID,
    SERVER_ID,
    build,
    request_for,
    settings,
    validate,
)

# Label syntax (k8s.io/apimachinery validation): values <= 63 characters, alphanumeric at both ends;
# keys an optional DNS-subdomain prefix and a name of the same form as values.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

ODD_OWNERS = ["alice", "alice@example.com", "Ünïcødé Üser", "x" * 100, "-weird-", "a.b_c-d", ""]
ODD_KERNEL_IDS = [KERNEL_ID, "Kernel_ID.With.Dots", "k" * 100, "UPPER-case-0123"]


def assert_valid_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        assert len(name) <= 63 and LABEL_VALUE.match(name) and name, key
        assert not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN.match(prefix)), key
        assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)


@pytest.mark.parametrize(("owner", "kernel_id"), list(itertools.product(ODD_OWNERS, ODD_KERNEL_IDS)))
def test_labels_and_names_are_valid_for_any_owner_and_kernel_id(owner: str, kernel_id: str) -> None:
    gpushare = settings(resource_preset="kai", kai_queue="research")
    pod, _ = kernel_pod(
        gpushare,
        kernel_id=kernel_id,
        server_id=f"{owner}@host-{owner}",
        owner=owner,
        request=request_for("vgpu"),
        cluster=cluster_facts(gpushare),
    )
    assert_valid_labels(pod["metadata"]["labels"])
    assert len(pod["metadata"]["name"]) <= 63 and DNS_LABEL.match(pod["metadata"]["name"])
    name = secret_name(kernel_id)
    assert len(name) <= 63 and DNS_LABEL.match(name)
    assert name == pod["spec"]["volumes"][0]["secret"]["secretName"]
    validate(pod)
    validate(make_secret(kernel_id, "s", owner, "default", {}, "t"))


def test_label_values_stay_readable_and_distinct() -> None:
    assert label_value("alice") == "alice"
    assert label_value("alice@example.com").startswith("alice-example.com-")
    assert label_value("alice@example.com") != label_value("alice#example.com")
    assert len(label_value("x" * 100)) <= 63
    assert label_value("x" * 100) != label_value("x" * 99)


def test_the_server_selector_matches_the_labels() -> None:
    labels = build()["metadata"]["labels"]
    for requirement in selector(SERVER_ID).split(","):
        key, value = requirement.split("=")
        assert labels[key] == value
    assert server_label(SERVER_ID) != server_label("bob@jupyter-bob")
    assert pod_name(KERNEL_ID) != pod_name("another")
