"""Fixtures for tests that start real kernels and servers on a simulated pool, and on the test
cluster: Kubernetes' own control plane (one per session, tests/conftest.py) and simulated nodes
(``kube``, ``make_kube``, ``module_kube``; tests/cluster/)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..cluster import ControlPlane, DraDriver, KubeCluster, RealNode, SimNode
from ..cluster.kueue import Kueue, in_namespaces
from ..support.kernels import write_kernelspec
from ..support.nodes import BROKEN_IMAGE, Node, make_node


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    """One simulated 80 GiB card; kernelspecs python3-gpu-30g, -4g and -16g installed."""
    yield make_node(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def no_connection_file_left_here() -> Iterator[None]:
    """Tests clean up: a kernel's connection file belongs in the test's runtime directory, never
    in the current one (the repository), where a killed run would leave it for ``git add``."""
    before = set(Path.cwd().glob("kernel-*.json"))
    yield
    left = sorted(set(Path.cwd().glob("kernel-*.json")) - before)
    for path in left:
        path.unlink()
    assert not left, f"connection files left in {Path.cwd()}: {[path.name for path in left]}"


@pytest.fixture(autouse=True)
def close_kernel_manager_contexts() -> Iterator[None]:
    """After each test, close the zmq contexts its kernel managers created, without lingering.

    A MultiKernelManager terminates its context when garbage-collected; if a kernel died with a
    message still queued for it, that termination blocks for ever — in whichever later test the
    collector happens to run. Closing with linger 0 here keeps each test's sockets its own.
    """
    yield
    import gc

    from jupyter_client.multikernelmanager import MultiKernelManager

    for candidate in gc.get_objects():
        # type(), not isinstance(): some objects (torch's lazy modules) warn when asked __class__.
        if issubclass(type(candidate), MultiKernelManager) and candidate._created_context:
            context = candidate._trait_values.get("context")
            if context is not None and not context.closed:
                context.destroy(linger=0)


# ---- the real control plane (tests/cluster/) ----------------------------------------------------


MakeKube = Callable[..., KubeCluster]


@pytest.fixture(scope="module")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """The cluster's real node (Kubernetes' kubelet on containerd and runc, tests/cluster/
    real_node.py), once per test module that asks for it: one per machine, so a module's tests
    share it. Its stop restores every host-wide change or fails the module's last test."""
    with RealNode(control_plane, tmp_path_factory.mktemp("real-node")) as node:
        yield node


@pytest.fixture(scope="module")
def kueue(
    control_plane: ControlPlane, kube_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kueue]:
    """Kueue (tests/cluster/kueue.py) for a test module, managing the module's namespace only;
    each test makes its own queues and removes them while Kueue still runs (its finalizers)."""
    with Kueue(
        control_plane,
        tmp_path_factory.mktemp("kueue"),
        namespaces=in_namespaces(kube_namespace),
        visibility=True,
    ) as running:
        yield running


@pytest.fixture
def make_kube(
    control_plane: ControlPlane,
    kube_namespace: str,
    node: Node,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[MakeKube]:
    """Starts this test's nodes on the real control plane: ``make_kube(nodes, driver=...)``
    returns the test's :class:`~tests.cluster.KubeCluster` (``$KUBECONFIG``: the Jupyter
    server's ServiceAccount under the shipped RBAC, in the module's namespace; the kernels' owner
    alice). Its nodes and everything in the namespace go when the test ends; the node side must
    have seen nothing a real cluster would refuse. ``make_kube(real_node=True)`` adds the real
    node (the module's ``real_node``; ``nodes=[]``: the real node alone)."""
    made: list[KubeCluster] = []
    with contextlib.ExitStack() as stack:

        def make(
            nodes: list[SimNode] | None = None,
            *,
            driver: DraDriver | None = None,
            broken_images: Iterable[str] = (BROKEN_IMAGE,),
            real_node: bool = False,
            **node_options: Any,
        ) -> KubeCluster:
            root = tmp_path / f"cluster-{len(made)}"
            cluster = KubeCluster(
                control_plane,
                kube_namespace,
                root,
                nodes,
                driver=driver,
                broken_images=broken_images,
                real_node=request.getfixturevalue("real_node") if real_node else None,
                **node_options,
            )
            stack.enter_context(cluster)
            made.append(cluster)
            monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
            monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
            return cluster

        yield make
    for cluster in made:
        assert cluster.violations == []


@contextlib.contextmanager
def module_kube(
    control_plane: ControlPlane,
    namespace: str,
    root: Path,
    nodes: list[SimNode] | None = None,
    *,
    driver: DraDriver | None = None,
) -> Iterator[KubeCluster]:
    """Nodes on the real control plane for a whole module (a hub and broker that outlive one
    test): what ``make_kube`` makes, without touching the test's ``$KUBECONFIG``; its node side
    must have seen nothing a real cluster would refuse."""
    with KubeCluster(
        control_plane, namespace, root, nodes, driver=driver, broken_images=(BROKEN_IMAGE,)
    ) as cluster:
        yield cluster
    assert cluster.violations == []


@pytest.fixture
def kube(node: Node, make_kube: MakeKube) -> KubeCluster:
    """Four HAMi nodes (one 80 GiB card each) on the real control plane; the kernelspecs of
    ``cluster`` (gpu-6g-vgpu, gpu-200g-vgpu) installed."""
    write_kernelspec(node, "gpu-6g-vgpu", {"gpu_memory": "6G", "gpu_mode": "vgpu", "gpu_cores": 30})
    write_kernelspec(node, "gpu-200g-vgpu", {"gpu_memory": "200G", "gpu_mode": "vgpu"})
    return make_kube()
