"""The backend roles (``jupyter_gpushare/backends/protocol.py``) are the ones docs/development.md
tabulates ("Backend roles"): each role's members are its row's, and each backend derives from the
roles the section says it implements."""

from __future__ import annotations

import re
from abc import ABC
from pathlib import Path

from jupyter_gpushare.backends import protocol
from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
from jupyter_gpushare.backends.local.backend import LocalBackend
from jupyter_gpushare.backends.local.cell_notes import LedgerNotes
from jupyter_gpushare.backends.protocol import Backend, CellNotes, NodeSlices

DEVELOPMENT = Path(__file__).parents[3] / "docs" / "development.md"
ROLES = {
    name: value
    for name, value in vars(protocol).items()
    if isinstance(value, type) and issubclass(value, ABC) and value is not ABC
}


def documented() -> dict[str, set[str]]:
    """Each row of the roles table: the role, and the names in backticks of its members."""
    section = DEVELOPMENT.read_text().split("\n## Backend roles\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


def members(role: type) -> set[str]:
    """A role's own members (what it declares, not what a role it extends does), and the roles it
    extends."""
    extended = [base for base in role.__bases__ if base in ROLES.values()]
    inherited = set().union(*(base.__abstractmethods__ for base in extended))
    declared = set(role.__abstractmethods__) - inherited
    return declared | set(vars(role).get("__annotations__", {})) | {base.__name__ for base in extended}


def test_every_role_is_in_the_table_with_its_members() -> None:
    assert set(ROLES) == {"Accounting", "Backend", "CellNotes", "Kernels", "NodeSlices", "Pool"}
    assert documented() == {name: members(role) for name, role in ROLES.items()}


def test_each_backend_implements_the_roles_the_section_names() -> None:
    for backend in (LocalBackend, RemoteBackend):
        assert issubclass(backend, Backend) and issubclass(backend, NodeSlices), backend
    assert issubclass(KubernetesBackend, Backend) and not issubclass(KubernetesBackend, NodeSlices)
    assert issubclass(LedgerNotes, CellNotes) and not issubclass(LedgerNotes, Backend)
