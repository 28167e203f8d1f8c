"""The backend kinds come from one registry: the entry-point group ``jupyter_gpushare.backends``.

Every place that lists or picks a kind asks it — ``c.GPUShare.backend``, the broker's
``--backend``, the OpenAPI document — and no code outside the kinds' own packages and the registry
branches on a kind's name or checks for a concrete backend's class.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml
from traitlets import TraitError

from jupyter_gpushare.backends import node_slices_for, registry
from jupyter_gpushare.backends.local.provisioner import LocalGPUShareProvisioner
from jupyter_gpushare.backends.registry import BackendKind, kind_named
from jupyter_gpushare.cli import build_parser
from jupyter_gpushare.config import GPUShare, kinds
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import ConfigurationError
from jupyter_gpushare.kernel import slice_handle as slice_handle_module
from jupyter_gpushare.kernel.node_handle import NodeSliceHandle
from jupyter_gpushare.kernel.pod_handle import PodSliceHandle

PACKAGE = Path(__file__).resolve().parents[3] / "jupyter_gpushare"

# A kind registered by these tests only (through the entry-point seam, not an installed package).
TEST_KIND = BackendKind(
    name="unit-test-kind",
    make_backend=kind_named("local").make_backend,
    provisioner=lambda settings: LocalGPUShareProvisioner,
)
NOT_A_KIND = object()


class ElsewhereBackend:
    """A third kind's backend whose kernels run elsewhere: it holds no kernel's own slice."""

    name = "unit-test-elsewhere"


# A kind that forgot to name its kernels' handle: its kernels would reach for a NodeSlices.
ELSEWHERE_KIND = BackendKind(
    name="unit-test-elsewhere",
    make_backend=lambda settings: ElsewhereBackend(),  # type: ignore[arg-type,return-value]
    provisioner=lambda settings: LocalGPUShareProvisioner,
)


@pytest.fixture
def with_test_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    installed = kinds.find_entry_points

    def also_ours() -> list[EntryPoint]:
        return [
            *installed(),
            EntryPoint("unit-test-kind", f"{__name__}:TEST_KIND", kinds.GROUP),
            EntryPoint("not-a-kind", f"{__name__}:NOT_A_KIND", kinds.GROUP),
            EntryPoint("unit-test-elsewhere", f"{__name__}:ELSEWHERE_KIND", kinds.GROUP),
        ]

    monkeypatch.setattr(kinds, "find_entry_points", also_ours)
    registry.forget()
    yield
    monkeypatch.undo()
    registry.forget()


def test_the_package_registers_its_two_kinds() -> None:
    assert kinds.kind_names() == ("kubernetes", "local")
    for name, kind in registry.installed_kinds().items():
        assert isinstance(kind, BackendKind) and kind.name == name
        assert kind.broker_side and kind.doctor_checks


def test_a_kind_registered_elsewhere_is_a_choice_everywhere(with_test_kind: None) -> None:
    assert "unit-test-kind" in kinds.kind_names()
    assert kind_named("unit-test-kind") is TEST_KIND
    assert GPUShare(backend="unit-test-kind").backend == "unit-test-kind"
    broker = build_parser()._subparsers._group_actions[0].choices["broker"]  # type: ignore[union-attr]
    [backend] = [action for action in broker._actions if action.dest == "backend"]
    assert "unit-test-kind" in backend.choices


def test_the_package_finds_its_own_kinds_without_reading_every_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every kernel's start looks up its kind: reading every installed distribution's metadata
    for it cost 10-20 ms of each start (benchmarks/kernel_start.py)."""
    read: list[str] = []

    def every_distribution() -> list[EntryPoint]:
        read.append("all")
        return []

    monkeypatch.setattr(kinds, "find_entry_points", every_distribution)
    registry.forget()
    try:
        assert kind_named("local").name == "local" and kind_named("kubernetes").name == "kubernetes"
        assert read == []
        with pytest.raises(ConfigurationError, match="unknown backend 'slurm'"):
            kind_named("slurm")  # another kind: every distribution is read for it
        assert read == ["all"]
    finally:
        monkeypatch.undo()
        registry.forget()


def test_an_entry_point_that_names_no_kind_is_one_sentence(with_test_kind: None) -> None:
    with pytest.raises(ConfigurationError, match="does not name a BackendKind called 'not-a-kind'"):
        kind_named("not-a-kind")


def test_an_unknown_backend_names_the_installed_kinds() -> None:
    with pytest.raises(
        TraitError, match=r"unknown backend 'slurm': the installed kinds are kubernetes, local"
    ):
        GPUShare(backend="slurm")
    with pytest.raises(ConfigurationError, match=r"unknown backend 'slurm'"):
        kind_named("slurm")


def test_each_kind_names_its_kernels_handle() -> None:
    handles = {name: registry.load(kind.slice_handle) for name, kind in registry.installed_kinds().items()}
    assert handles == {"local": NodeSliceHandle, "kubernetes": PodSliceHandle}
    assert TEST_KIND.slice_handle == kind_named("local").slice_handle  # the default: NodeSliceHandle


@pytest.mark.parametrize(
    ("kind", "handle"), [("local", NodeSliceHandle), ("kubernetes", PodSliceHandle), ("", NodeSliceHandle)]
)
def test_a_kernel_takes_the_handle_of_the_kind_its_provisioner_named(
    kind: str, handle: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_names.BACKEND, kind)
    monkeypatch.setattr(slice_handle_module, "_chosen", None)
    assert type(slice_handle_module.slice_handle()) is handle


def test_a_kernel_of_a_kind_not_installed_runs_on_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_names.BACKEND, "slurm")
    monkeypatch.setattr(slice_handle_module, "_chosen", None)
    with pytest.raises(
        ConfigurationError, match=r"unknown backend 'slurm': the installed kinds are kubernetes, local"
    ):
        slice_handle_module.slice_handle()
    # The extension still loads (in a process of its own: it hooks imports): %gpu is there to
    # say the same sentence, and the kernel runs on.
    probe = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "import jupyter_gpushare.kernel as side\n"
        "shell = InteractiveShell()\n"
        "side.load_ipython_extension(shell)\n"
        "print('gpu' in shell.magics_manager.magics['line'])"
    )
    seen = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, env_names.BACKEND: "slurm"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert seen.stdout.strip() == "True", seen.stdout + seen.stderr
    assert "GPU: unknown backend 'slurm'" in seen.stderr, seen.stderr


def test_a_kind_without_a_kernel_handle_of_its_own_needs_a_backend_that_holds_slices(
    with_test_kind: None,
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^the unit-test-elsewhere backend does not hold a kernel's own slice"
    ):
        node_slices_for(GPUShare(backend="unit-test-elsewhere"))


def test_a_kind_is_light_to_look_up() -> None:
    """A kernel looks its kind up before its first cell: no backend, provisioner, ledger or
    cluster client comes with the kind."""
    probe = (
        "import sys\n"
        "from jupyter_gpushare.backends.registry import installed_kinds\n"
        "installed_kinds()\n"
        "heavy = ('.backends.local.backend', '.backends.local.provisioner', '.ledger', '.objects', "
        "'.cluster', '.backends.kubernetes.backend', '.backends.protocol', '.config.traits', "
        "'.config.loading')\n"
        "print(sorted(m for m in sys.modules if m.startswith('jupyter_gpushare') and m.endswith(heavy)))\n"
        "print('kubernetes' in sys.modules)"
    )
    seen = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert seen.stdout.split("\n")[:2] == ["[]", "False"], seen.stdout + seen.stderr


def test_the_openapi_enum_is_the_registrys_names() -> None:
    # types.ts mirrors this enum (tests/unit/test_labextension_types.py).
    document = yaml.safe_load((PACKAGE / "openapi.yaml").read_text())
    assert sorted(document["components"]["schemas"]["Pool"]["properties"]["backend"]["enum"]) == list(
        kinds.kind_names()
    )


# What a branch on the kind looks like: its name compared, or a concrete backend's class checked.
KIND_BRANCHES = re.compile(
    r"""\.backend\s*(==|!=|\bin\b|\bnot\s+in\b)"""
    r"""|\b(name|kind)\s*(==|!=)\s*["'](local|kubernetes)["']"""
    r"""|["'](local|kubernetes)["']\s*(==|!=|\bin\b)"""
    r"""|isinstance\([^)]*\b(Local|Kubernetes|Remote)Backend\b"""
)
# Where branching on the kind is the job: the registry and the kinds' own packages.
KINDS_OWN = ("backends/registry.py", "backends/local/", "backends/kubernetes/")


def kind_branches() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(KINDS_OWN):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if KIND_BRANCHES.search(line.split("#")[0]):
                found.setdefault(relative, []).append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_branch_on_the_kind_outside_the_registry_and_the_kinds() -> None:
    found = kind_branches()
    assert not found, "\n".join(line for lines in found.values() for line in lines)


def test_the_search_finds_a_branch_where_there_is_one() -> None:
    for line in (
        'if settings.backend == "kubernetes":',
        "elif self.settings.backend in ('local',):",
        'return self.name == "kubernetes"',
        "if not isinstance(backend, LocalBackend):",
        '"local" == settings.backend',
    ):
        assert KIND_BRANCHES.search(line), line
    assert not KIND_BRANCHES.search("backend = backend_for(settings)")
