"""The node simulator's label and field selectors (tests/integration/k8s_sim/selectors.py).

The backend lists and watches its pods, Secrets and events by selector; the emulated API server
must select as the real one does, or the integration tests would pass against a cluster that
answers differently. Expected answers follow the Kubernetes documentation ("Labels and
Selectors", "Field Selectors"): ``!=`` and ``notin`` match objects without the label, a missing
field reads as the empty string, and what cannot be parsed is a 400.
"""

from __future__ import annotations

from typing import Any

import pytest
from kmock import KubernetesError

from tests.integration.k8s_sim.resources import EVENTS, NODES, PODS, SECRETS
from tests.integration.k8s_sim.selectors import field_matcher, label_matcher

ML_GPU = {"team": "ml", "tier": "gpu"}
WEB = {"team": "web"}
UNLABELLED: dict[str, str] = {}
OWNED = {"jupyter-gpushare.io/owner": "alice", "app.kubernetes.io/name": "jupyter-gpushare"}

# (selector, labels, whether they match)
LABEL_CASES: list[tuple[str, dict[str, str], bool]] = [
    # An empty selector selects everything.
    ("", ML_GPU, True),
    ("", UNLABELLED, True),
    # Equality: = and == alike; a missing label is not equal.
    ("team=ml", ML_GPU, True),
    ("team=ml", WEB, False),
    ("team=ml", UNLABELLED, False),
    ("team==ml", ML_GPU, True),
    ("team==ml", WEB, False),
    (" team = ml ", ML_GPU, True),
    ("jupyter-gpushare.io/owner=alice", OWNED, True),
    ("jupyter-gpushare.io/owner=bob", OWNED, False),
    # Inequality: also true where the label is missing.
    ("team!=ml", WEB, True),
    ("team!=ml", ML_GPU, False),
    ("team!=ml", UNLABELLED, True),
    # Set-based: in needs the label; notin is also true without it.
    ("team in (ml,web)", ML_GPU, True),
    ("team in (ml, web)", WEB, True),
    ("team in (web,ops)", ML_GPU, False),
    ("team in (ml)", UNLABELLED, False),
    ("team notin (web)", ML_GPU, True),
    ("team notin (web,ops)", WEB, False),
    ("team notin (web)", UNLABELLED, True),
    # Existence and absence.
    ("tier", ML_GPU, True),
    ("tier", WEB, False),
    ("!tier", WEB, True),
    ("!tier", ML_GPU, False),
    # Requirements are ANDed; commas inside a set do not split requirements.
    ("team=ml,tier", ML_GPU, True),
    ("team=ml,tier", {"team": "ml"}, False),
    ("team==ml,tier=gpu", ML_GPU, True),
    ("team in (ml,web),!tier", WEB, True),
    ("team in (ml,web),!tier", ML_GPU, False),
    ("team notin (web),!x", ML_GPU, True),
    ("app.kubernetes.io/name=jupyter-gpushare,jupyter-gpushare.io/owner=alice", OWNED, True),
    ("app.kubernetes.io/name=jupyter-gpushare,jupyter-gpushare.io/owner=bob", OWNED, False),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), LABEL_CASES)
def test_label_selectors_select_as_the_api_does(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert label_matcher(selector)(labels) is matches


@pytest.mark.parametrize(
    "selector",
    [
        "team=(",  # a set after an equality
        "!team=ml",  # absence takes no value
        "team in ml",  # a set needs parentheses
        "team notin",  # and a set
        "team ml",  # no operator
        "team=ml,=web",  # no key
        "te am=ml",
    ],
)
def test_a_label_selector_that_cannot_be_parsed_is_a_bad_request(selector: str) -> None:
    with pytest.raises(KubernetesError) as refused:
        label_matcher(selector)
    assert (refused.value.status, refused.value.reason) == (400, "BadRequest")
    assert "unable to parse requirement" in str(refused.value.message)


PENDING = {"metadata": {"name": "p1", "namespace": "kernels"}, "spec": {}, "status": {"phase": "Pending"}}
RUNNING = {
    "metadata": {"name": "p2", "namespace": "kernels"},
    "spec": {"nodeName": "gpu-node-1", "schedulerName": "hami-scheduler"},
    "status": {"phase": "Running"},
}
FAILED_SCHEDULING = {
    "metadata": {"name": "p1.abcde", "namespace": "kernels"},
    "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "kernels"},
    "reason": "FailedScheduling",
    "type": "Warning",
    "source": {"component": "default-scheduler"},
}
SECRET = {"metadata": {"name": "s", "namespace": "kernels"}, "type": "Opaque"}
NODE = {"metadata": {"name": "gpu-node-1"}, "spec": {}}

# (kind, selector, object, whether it matches)
FIELD_CASES: list[tuple[Any, str, dict[str, Any], bool]] = [
    (PODS, "", PENDING, True),
    (PODS, "metadata.name=p1", PENDING, True),
    (PODS, "metadata.name==p1", RUNNING, False),
    (PODS, "status.phase!=Running", PENDING, True),
    (PODS, "status.phase!=Running", RUNNING, False),
    # A field the object does not have reads as "": unbound pods have spec.nodeName="".
    (PODS, "spec.nodeName=", PENDING, True),
    (PODS, "spec.nodeName=", RUNNING, False),
    (PODS, "spec.nodeName=gpu-node-1,status.phase=Running", RUNNING, True),
    (PODS, "spec.nodeName=gpu-node-1,status.phase=Pending", RUNNING, False),
    (PODS, "spec.schedulerName=hami-scheduler", RUNNING, True),
    (PODS, "metadata.namespace=kernels", RUNNING, True),
    # Events as kubectl describe reads them; source is the reporting component.
    (EVENTS, "involvedObject.name=p1", FAILED_SCHEDULING, True),
    (EVENTS, "involvedObject.name=p2", FAILED_SCHEDULING, False),
    (EVENTS, "involvedObject.kind=Pod,reason=FailedScheduling,type=Warning", FAILED_SCHEDULING, True),
    (EVENTS, "source=default-scheduler", FAILED_SCHEDULING, True),
    (EVENTS, "source=kubelet", FAILED_SCHEDULING, False),
    (SECRETS, "type=Opaque", SECRET, True),
    (SECRETS, "metadata.name!=s", SECRET, False),
    (NODES, "metadata.name=gpu-node-1", NODE, True),
]


@pytest.mark.parametrize(("kind", "selector", "obj", "matches"), FIELD_CASES)
def test_field_selectors_select_as_the_api_does(
    kind: Any, selector: str, obj: dict[str, Any], matches: bool
) -> None:
    assert field_matcher(selector, kind)(obj) is matches


@pytest.mark.parametrize(
    ("kind", "selector", "message"),
    [
        (PODS, "spec.nonsense=1", "field label not supported: spec.nonsense"),
        (SECRETS, "status.phase=Running", "field label not supported: status.phase"),  # a pod's field
        (NODES, "spec.nodeName=x", "field label not supported: spec.nodeName"),
        (PODS, "metadata.name", "invalid field selector: 'metadata.name'"),
        (PODS, "metadata.name in (a)", "invalid field selector"),
    ],
)
def test_a_field_the_kind_cannot_be_selected_on_is_a_bad_request(
    kind: Any, selector: str, message: str
) -> None:
    with pytest.raises(KubernetesError) as refused:
        field_matcher(selector, kind)
    assert (refused.value.status, refused.value.reason) == (400, "BadRequest")
    assert message in str(refused.value.message)
