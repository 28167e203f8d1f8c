"""The jupyter server on the simulated cluster that most tests of this package use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import Node
from ..k8s_sim import SimulatedCluster
from ..servers import JupyterServer
from .support import server_for


@pytest.fixture
def server(node: Node, cluster: SimulatedCluster) -> Iterator[JupyterServer]:
    """A jupyter server on the Kubernetes backend (HAMi preset) pointing at ``cluster``."""
    started = server_for(node, cluster)
    yield started
    started.stop()
