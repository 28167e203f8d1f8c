"""Fixtures every kind of test may use: the test cluster's control plane, one per session, and a
namespace per test module (tests/cluster/; the integration tests' nodes are in
tests/integration/conftest.py).

Before anything else: the Jupyter directories of the whole test session are its own, so that
nothing on the machine changes a result — neither a machine-wide ``/etc/jupyter`` (which names a
broker on a team box), nor root's ``~/.jupyter``, nor a ``JUPYTER_GPUSHARE_*`` variable of the shell
that runs the tests, nor its ``NVIDIA_VISIBLE_DEVICES`` (a GPU container's: the simulated NVML
serves only the cards it names, as inside a container). jupyter_core reads the system directories
once, when it is first imported: with ``JUPYTER_PLATFORM_DIRS`` they are
``$XDG_CONFIG_DIRS/jupyter``, which is set here to the session's own (empty) directory. Every
process a test starts inherits this environment unless the test gives it a whole environment of its
own (those set the same variables).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_JUPYTER_HOME = tempfile.mkdtemp(prefix="gpushare-tests-jupyter-")
atexit.register(shutil.rmtree, _JUPYTER_HOME, ignore_errors=True)
for _variable in [name for name in os.environ if name.startswith("JUPYTER_GPUSHARE_")] + [
    "JUPYTER_CONFIG_PATH",
    "JUPYTER_NO_CONFIG",
    "JUPYTER_PREFER_ENV_PATH",
    "NVIDIA_VISIBLE_DEVICES",
]:
    os.environ.pop(_variable, None)
os.environ.update(
    {
        "JUPYTER_PLATFORM_DIRS": "1",
        "XDG_CONFIG_DIRS": os.path.join(_JUPYTER_HOME, "system"),
        "JUPYTER_CONFIG_DIR": os.path.join(_JUPYTER_HOME, "config"),
        "JUPYTER_DATA_DIR": os.path.join(_JUPYTER_HOME, "data"),
        "JUPYTER_RUNTIME_DIR": os.path.join(_JUPYTER_HOME, "runtime"),
    }
)

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from .cluster import ControlPlane, Namespace, namespace_for  # noqa: E402
from .support.hermetic import foreign_config_directories  # noqa: E402

# Something imported jupyter_core before the lines above ran: its system directories would be the
# machine's. Fail at once rather than let the machine's configuration decide results.
assert not foreign_config_directories(_JUPYTER_HOME), foreign_config_directories(_JUPYTER_HOME)


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
