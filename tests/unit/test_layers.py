"""The import contracts of pyproject.toml hold, and they can fail.

``make lint`` runs ``lint-imports`` on the package; here the same contracts run on a copy of the
package into which an upward import — hidden inside a function, where reviewers miss it — has
been added, and must be reported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(directory / "pyproject.toml")],
        cwd=directory,
        env={"PYTHONPATH": str(directory), "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "jupyter_gpushare",
        tmp_path / "jupyter_gpushare",
        ignore=shutil.ignore_patterns("__pycache__", "labextension"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "import_contracts.py", tmp_path / "tests" / "import_contracts.py")
    return tmp_path


def test_the_package_keeps_its_contracts(package_copy: Path) -> None:
    result = lint(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_inside_a_function_breaks_the_layers(package_copy: Path) -> None:
    sizes = package_copy / "jupyter_gpushare" / "core" / "sizes.py"
    sizes.write_text(
        sizes.read_text() + "\n\ndef _shortcut():\n    from jupyter_gpushare.server import routes\n"
    )
    result = lint(package_copy)
    assert result.returncode == 1
    assert "Layers run one way" in result.stdout and "BROKEN" in result.stdout
    assert "jupyter_gpushare.core.sizes -> jupyter_gpushare.server.routes" in result.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("modes/timeslice.py", "from jupyter_gpushare.backends.kubernetes.objects.claims import claim_spec"),
        ("pods/requests.py", "import kubernetes.client"),
    ],
)
def test_a_mode_object_importing_the_cluster_layer_is_reported(
    package_copy: Path, module: str, imported: str
) -> None:
    source = package_copy / "jupyter_gpushare" / "core" / module
    source.write_text(source.read_text() + f"\n\ndef _shortcut():\n    {imported}\n")
    result = lint(package_copy)
    assert result.returncode == 1
    contract = "Mode objects know pods and claims as data only: no backend, no cluster I/O, no API client"
    assert f"{contract} BROKEN" in " ".join(result.stdout.split())


def test_a_cycle_between_siblings_is_reported(package_copy: Path) -> None:
    stream = package_copy / "jupyter_gpushare" / "server" / "stream.py"
    stream.write_text(
        stream.read_text() + "\n\ndef _back():\n    from jupyter_gpushare.server import routes\n"
    )
    result = lint(package_copy)
    assert result.returncode == 1
    assert "No cycles are allowed in jupyter_gpushare.server" in result.stdout


def test_a_pure_module_using_tornado_is_reported(package_copy: Path) -> None:
    allocator = package_copy / "jupyter_gpushare" / "core" / "placement" / "allocator.py"
    allocator.write_text(allocator.read_text() + "\n\ndef _http():\n    import tornado.web\n")
    result = lint(package_copy)
    assert result.returncode == 1
    assert "jupyter_gpushare.core.placement.allocator -> tornado" in result.stdout


def test_a_package_importing_back_from_its_own_submodule_is_reported(package_copy: Path) -> None:
    # The shape provisioners/base.py had: a submodule importing its own package inside a function,
    # while the package imports the submodule. Siblings alone show no cycle here.
    common = package_copy / "jupyter_gpushare" / "doctor" / "common.py"
    common.write_text(
        common.read_text() + "\n\ndef _all():\n    from jupyter_gpushare.doctor import run_checks\n"
    )
    result = lint(package_copy)
    assert result.returncode == 1
    lines = " ".join(result.stdout.split())
    assert "No import cycles between the modules of a package KEPT" in lines
    assert "or modules across packages BROKEN" in lines
    assert "jupyter_gpushare.doctor.common -> jupyter_gpushare.doctor" in lines


def test_what_the_broker_sides_share_importing_a_kind_is_reported(package_copy: Path) -> None:
    # backends/broker_base/ lies under the kinds' packages: the broker and the kinds' sides both
    # build on it, so it may not reach back into a kind (that would put the broker over a kind).
    handler = package_copy / "jupyter_gpushare" / "backends" / "broker_base" / "handler.py"
    handler.write_text(
        handler.read_text()
        + "\n\ndef _local():\n    from jupyter_gpushare.backends.local.broker import slice_routes\n"
    )
    result = lint(package_copy)
    assert result.returncode == 1
    lines = " ".join(result.stdout.split())
    assert "a room per kind over what the kinds share, the Protocol at the bottom BROKEN" in lines
    backends = "jupyter_gpushare.backends"
    assert f"{backends}.broker_base.handler -> {backends}.local.broker.slice_routes" in lines
