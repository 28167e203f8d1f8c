"""The backend kinds, by name: the one place that turns ``c.GPUShare.backend`` into code.

Each kind is a :class:`BackendKind` that a package registers under the entry-point group
``jupyter_gpushare.backends`` (this package: ``local`` and ``kubernetes``, in pyproject.toml),
as jupyter_client finds kernel provisioners. Whoever needs the kind's code looks it up here —
the backend (:func:`jupyter_gpushare.backends.backend_for`), the provisioner
(``gpushare-provisioner``), the broker's side, the doctor's checks — and never asks which kind
it has. docs/development.md ("Adding a backend") walks through a third kind.

A kind's broker side, doctor checks and kernel handle are built on modules above this layer (the
broker's routes, the doctor's lines, the kernel's magics), so a kind names them as
``"module:attribute"`` references, as an entry point names its object, and the front end that
uses one loads it (:func:`load`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_gpushare.config import kinds
from jupyter_gpushare.core.errors import ConfigurationError

if TYPE_CHECKING:
    from jupyter_gpushare.backends.protocol import Backend, CellNotes
    from jupyter_gpushare.backends.provisioning import SliceProvisioner
    from jupyter_gpushare.config import GPUShare


@dataclass(frozen=True)
class BackendKind:
    """One kind of backend and everything of it that the rest of the package looks up. (What a
    kernel can do with its slice is its backend's ``capabilities``: it varies with the settings,
    a broker's clients offering less than the ledger.)"""

    name: str  # the value of c.GPUShare.backend that selects it
    # This process's backend for the settings (built once per process and settings).
    make_backend: Callable[[GPUShare], Backend]
    # The class ``gpushare-provisioner`` builds for the settings (one kind may have several,
    # e.g. pods a server creates itself or pods a broker creates for it).
    provisioner: Callable[[GPUShare], type[SliceProvisioner]]
    # "module:attribute" of the broker's side (a jupyter_gpushare.backends.broker_base.side.BrokerSide);
    # empty where ``jupyter gpushare broker`` cannot hold this kind.
    broker_side: str = ""
    # "module:attribute" of the doctor's checks: a function (settings, inventory or None) ->
    # jupyter_gpushare.core.findings.Findings; empty where the kind has none of its own.
    doctor_checks: str = ""
    # "module:attribute" of a kernel's handle on its own slice (what %gpu and the Python API
    # call): a callable taking no arguments that returns a jupyter_gpushare.kernel.slice_handle.SliceHandle.
    # By default the kernel acts on its slice through this kind's backend, which must then be
    # a NodeSlices (as the local kind's is); a kind whose kernels run elsewhere names its own.
    slice_handle: str = "jupyter_gpushare.kernel.node_handle:NodeSliceHandle"
    # What a kernel tells and asks of its slice around every cell, where building the backend
    # costs more than a cell should (the local kind probes devices): a factory (settings) ->
    # CellNotes, or None for a kernel with nothing to note. None here: the backend answers.
    cell_notes: Callable[[GPUShare], CellNotes | None] | None = None


_loaded: dict[str, BackendKind] = {}


def kind_named(name: str) -> BackendKind:
    """The kind called ``name`` (only its own modules are imported); one sentence naming the
    installed ones where there is none."""
    kind = _loaded.get(name)
    if kind is not None:
        return kind
    entry_point = kinds.kind_entry_point(name)
    if entry_point is None:
        raise ConfigurationError(
            f"unknown backend {name!r}: the installed kinds are {', '.join(kinds.kind_names())}"
        )
    kind = entry_point.load()
    if not isinstance(kind, BackendKind) or kind.name != name:
        raise ConfigurationError(
            f"the entry point {name} = {entry_point.value} of group {kinds.GROUP} does not name "
            f"a BackendKind called {name!r}"
        )
    _loaded[name] = kind
    return kind


def installed_kinds() -> dict[str, BackendKind]:
    """Every installed kind by name."""
    return {name: kind_named(name) for name in kinds.kind_names()}


def kind_for(settings: GPUShare) -> BackendKind:
    """The kind ``settings`` choose (``c.GPUShare.backend``)."""
    return kind_named(settings.backend)


def forget() -> None:
    """Find the kinds again at the next question (a test that installed or removed one)."""
    _loaded.clear()
    kinds.forget()


def load(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names (a kind's broker side, doctor checks
    or kernel handle)."""
    module, _, attribute = reference.partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        target = getattr(target, part)
    return target


__all__ = ["BackendKind", "forget", "installed_kinds", "kind_for", "kind_named", "load"]
