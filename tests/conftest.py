"""Fixtures every kind of test may use: the test cluster's control plane, one per session, and a
namespace per test module (tests/cluster/; the integration tests' nodes are in
tests/integration/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import ControlPlane, Namespace, namespace_for


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """kube-apiserver, kube-scheduler and kube-controller-manager, once per test session."""
    with ControlPlane(tmp_path_factory.mktemp("controlplane")) as plane:
        yield plane


@pytest.fixture(scope="module")
def kube_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """The test module's namespace, with the shipped RBAC (examples/kubernetes) applied to it."""
    namespace = Namespace(control_plane, namespace_for(request.module.__name__)).create()
    yield namespace.name
    namespace.delete()
