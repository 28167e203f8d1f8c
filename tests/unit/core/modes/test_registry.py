"""The sharing modes come from one registry: the entry-point group ``jupyter_gpushare.modes``.

Every place that lists or picks a mode asks it — ``c.GPUShare.default_mode`` and
``dra_fallbacks``, the commands' ``--mode``, ``%gpu request --mode``, the OpenAPI document a
server serves — and no code outside a mode's own module branches on a mode's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml
from traitlets import TraitError

from jupyter_gpushare.cli import build_parser
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import ConfigurationError
from jupyter_gpushare.core.modes import MODES, Mode, UnknownModeError, get_mode, mode_names, registry
from jupyter_gpushare.core.modes.timeslice import TimesliceMode
from jupyter_gpushare.kernel.magics import _parser as magic_parser
from jupyter_gpushare.server.openapi_document import served_document, with_modes

PACKAGE = Path(__file__).resolve().parents[4] / "jupyter_gpushare"
OWN = ("exclusive", "mig", "mps", "timeslice", "vgpu")


class UnitTestMode(TimesliceMode):
    """A mode registered by these tests only (through the entry-point seam)."""

    name = "unit-test-mode"  # type: ignore[assignment]


class Misnamed(TimesliceMode):
    name = "not-its-entry-point"  # type: ignore[assignment]


class UpperCase(TimesliceMode):
    name = "Loud"  # type: ignore[assignment]


NOT_A_MODE = object()


@pytest.fixture
def with_test_modes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    installed = registry.find_entry_points

    def also_ours() -> list[EntryPoint]:
        return [
            *installed(),
            EntryPoint("unit-test-mode", f"{__name__}:UnitTestMode", registry.GROUP),
            EntryPoint("not-a-mode", f"{__name__}:NOT_A_MODE", registry.GROUP),
            EntryPoint("misnamed", f"{__name__}:Misnamed", registry.GROUP),
            EntryPoint("Loud", f"{__name__}:UpperCase", registry.GROUP),
            # Another package cannot take the name of one of ours.
            EntryPoint("mps", f"{__name__}:UnitTestMode", registry.GROUP),
        ]

    monkeypatch.setattr(registry, "find_entry_points", also_ours)
    registry.forget()
    served_document.cache_clear()
    yield
    monkeypatch.undo()
    registry.forget()
    served_document.cache_clear()


def test_the_package_registers_its_five_modes() -> None:
    assert mode_names() == OWN
    for name, mode in MODES.items():
        assert isinstance(mode, Mode) and mode.name == name and mode.enforcement
    assert len(MODES) == 5 and "timeslice" in MODES and "quantum" not in MODES and None not in MODES


def test_a_mode_registered_elsewhere_is_a_choice_everywhere(with_test_modes: None) -> None:
    assert "unit-test-mode" in mode_names() and isinstance(get_mode("unit-test-mode"), UnitTestMode)
    assert GPUShare(default_mode="unit-test-mode").default_mode == "unit-test-mode"
    assert GPUShare(dra_fallbacks=["mig", "unit-test-mode"]).dra_fallbacks == ["mig", "unit-test-mode"]
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    kernelspec = commands["kernelspec"]._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in (commands["render-pod"], commands["profiles"], kernelspec["install"]):
        [mode] = [action for action in command._actions if action.dest == "mode"]
        assert "unit-test-mode" in mode.choices, command.prog
    assert magic_parser().parse_args(["request", "2G", "--mode", "unit-test-mode"]).mode == "unit-test-mode"
    enum = yaml.safe_load(served_document())["components"]["schemas"]["Mode"]["enum"]
    assert "unit-test-mode" in enum and set(OWN) <= set(enum)
    # The package's own mps stays its own.
    assert type(get_mode("mps")).__name__ == "MPSMode"


def test_the_package_finds_its_own_modes_without_reading_every_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every kernel's start looks its mode up: its own modes cost one distribution's metadata."""
    read: list[str] = []

    def every_distribution() -> list[EntryPoint]:
        read.append("all")
        return []

    monkeypatch.setattr(registry, "find_entry_points", every_distribution)
    registry.forget()
    try:
        assert [get_mode(name).name for name in ("timeslice", "vgpu")] == ["timeslice", "vgpu"]
        assert read == []
        with pytest.raises(UnknownModeError, match="unknown GPU mode 'quantum'"):
            get_mode("quantum")  # another mode: every distribution is read for it
        assert read == ["all"]
    finally:
        monkeypatch.undo()
        registry.forget()


@pytest.mark.parametrize(
    ("name", "sentence"),
    [
        ("not-a-mode", "does not name a Mode subclass called 'not-a-mode'"),
        ("misnamed", "does not name a Mode subclass called 'misnamed'"),
        ("Loud", "a mode's name is lower-case letters, digits and '-'"),
    ],
)
def test_an_entry_point_that_names_no_usable_mode_is_one_sentence(
    with_test_modes: None, name: str, sentence: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(sentence)):
        get_mode(name)


def test_an_unknown_mode_is_refused_where_it_is_set() -> None:
    sentence = (
        "GPUShare.default_mode: unknown GPU mode 'quantum'; choose one of: exclusive, mig, mps, "
        "timeslice, vgpu"
    )
    with pytest.raises(TraitError, match=re.escape(sentence)):
        GPUShare(default_mode="quantum")
    with pytest.raises(TraitError, match=r"GPUShare\.dra_fallbacks: unknown GPU mode 'quantum'"):
        GPUShare(dra_fallbacks=["mig", "quantum"])


def test_the_served_document_lists_the_modes_and_changes_nothing_else() -> None:
    shipped = (PACKAGE / "openapi.yaml").read_text()
    document = yaml.safe_load(shipped)
    assert "enum" not in document["components"]["schemas"]["Mode"]  # any installed mode passes
    served = with_modes(shipped, ["exclusive", "toy"])
    document["components"]["schemas"]["Mode"]["enum"] = ["exclusive", "toy"]
    assert yaml.safe_load(served) == document
    assert served.replace('      enum: ["exclusive", "toy"]\n', "") == shipped
    with pytest.raises(ValueError, match="one Mode schema"):
        with_modes(shipped.replace("    Mode:\n", "    Modus:\n"), ["toy"])


# What a branch on a mode looks like: a mode's name compared, or looked for in a list of names.
NAMES = r"""["'](exclusive|timeslice|mps|vgpu|mig)["']"""
MODE_BRANCHES = re.compile(
    rf"""\bmode(\.name)?\s*(==|!=)\s*{NAMES}|{NAMES}\s*(==|!=)\s*\w*mode\b"""
    rf"""|\bmode(\.name)?\s+(not\s+)?in\s*[(\[{{]\s*{NAMES}"""
)
# Where a branch on a mode's name is the job: the modes' own modules. And the exceptions, each with
# its reason: the local doctor's MIG, MPS and HAMi-core lines probe the node themselves (what
# each needs to find is the local kind's, not the mode's); a suspend refused by the driver names
# MPS as the likely cause.
MODES_OWN = ("core/modes/", "backends/local/doctor.py", "backends/local/suspend.py")


def mode_branches() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(MODES_OWN):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if MODE_BRANCHES.search(line.split("#")[0]):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_branch_on_a_modes_name_outside_its_own_module() -> None:
    found = mode_branches()
    assert not found, "\n".join(found)


def test_the_search_finds_a_branch_where_there_is_one() -> None:
    for line in (
        'if mode == "vgpu":',
        "if mode in ('timeslice', 'mps'):",
        'resource = preset.timeslice_gpu if mode == "timeslice" else preset.mps_gpu',
        'if request.mode.name != "exclusive":',
        '"mig" == default_mode',
    ):
        assert MODE_BRANCHES.search(line), line
    assert not MODE_BRANCHES.search('placement = "mig"')
    assert not MODE_BRANCHES.search('mode: str = "vgpu",')
