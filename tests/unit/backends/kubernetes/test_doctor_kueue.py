"""``doctor``'s Kueue line where the cluster serves no Workload API. The test cluster cannot show
this once any test has installed Kueue's CRDs into it (they are cluster-wide), so the API server
is substituted here by a stand-in that answers as one without Kueue does; with Kueue, and without
the Role's ``list workloads``, the line is tested against the real authorizer in
tests/integration/test_kueue.py."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
from jupyter_gpushare.backends.kubernetes.doctor import check_kueue


class WithoutKueue:
    """The API as a cluster without Kueue answers: the caller may list workloads (a Role can
    name a resource no one serves), and every Workload version is not found."""

    namespace = "notebooks"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def allowed(self, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        return (verb, resource, group) == ("list", "workloads", "kueue.x-k8s.io")

    def list_workloads(self, selector: str, version: str) -> list[dict[str, Any]]:
        self.asked.append(version)
        raise ClusterError(f"the server could not find the requested resource (workloads, {version})", 404)


def test_a_kueue_queue_on_a_cluster_without_kueue_is_a_warning_with_the_fix() -> None:
    cluster = WithoutKueue()
    check = check_kueue(cluster, "gpu")
    assert check.status == "WARN"
    assert check.detail == (
        "kernels are labelled for LocalQueue gpu, but this cluster serves no Kueue Workload API: "
        "without Kueue they start without waiting for quota"
    )
    assert "docs/admins/kueue.md" in check.fix
    assert cluster.asked == ["v1beta2", "v1beta1"]  # both versions Kueue has served


class WithoutVisibility(WithoutKueue):
    """Kueue serves its Workloads, but not its visibility API (VisibilityOnDemand off)."""

    def allowed(self, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        return True

    def list_workloads(self, selector: str, version: str) -> list[dict[str, Any]]:
        return []

    def pending_workloads(self, local_queue: str, version: str) -> list[dict[str, Any]]:
        self.asked.append(version)
        raise ClusterError(
            "the Kubernetes API refused to read LocalQueue gpu's pending workloads in namespace "
            "notebooks: the server could not find the requested resource",
            404,
        )


def test_kueue_without_its_visibility_api_is_a_warning_with_the_fix() -> None:
    cluster = WithoutVisibility()
    check = check_kueue(cluster, "gpu")
    assert (check.status, check.detail) == (
        "WARN",
        "kernels wait in LocalQueue gpu saying Kueue's reason, but not their place: Kueue serves no "
        "visibility API here",
    )
    assert "VisibilityOnDemand" in check.fix
    assert cluster.asked == ["v1beta2", "v1beta1"]
