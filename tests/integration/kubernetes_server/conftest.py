"""The jupyter server on the test cluster (tests/cluster/) that most tests of this package use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ...cluster import KubeCluster
from ...support.nodes import Node
from ...support.servers import JupyterServer
from .support import server_for


@pytest.fixture
def server(node: Node, kube: KubeCluster) -> Iterator[JupyterServer]:
    """A jupyter server on the Kubernetes backend (HAMi preset) pointing at ``kube``."""
    started = server_for(node, kube)
    yield started
    started.stop()
