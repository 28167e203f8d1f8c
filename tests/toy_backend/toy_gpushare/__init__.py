"""A third backend kind, ``toy``, as another package would add one (docs/development.md, "Adding
a backend"); tests/integration/test_toy_backend.py installs it beside jupyter_gpushare and starts a
kernel through it.

It registers a :class:`~jupyter_gpushare.backends.registry.BackendKind` under the entry-point
group ``jupyter_gpushare.backends`` (the test writes the distribution's ``entry_points.txt``).
Its slices are the node ledger's, as the local kind's are; what is its own is its name, the pool
it reports under that name, the provisioner that marks its kernels, and a doctor check. Its
kernels keep the default handle (``BackendKind.slice_handle``): ``%gpu`` in a toy kernel acts
through the toy backend, which also answers the calls around every cell (no ``cell_notes``).
"""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.local.provisioner import LocalGPUShareProvisioner
from jupyter_gpushare.backends.registry import BackendKind
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.findings import Check, Findings
from jupyter_gpushare.core.payloads import PoolPayload

MARK = "TOY_GPUSHARE_KERNEL"  # what its provisioner adds to a kernel's environment


class ToyBackend(LocalBackend):
    name = "toy"

    def pool(self) -> PoolPayload:
        pool = super().pool()
        pool["backend"] = self.name
        return pool


_backends: dict[str, ToyBackend] = {}


def toy_backend(settings: GPUShare) -> ToyBackend:
    """One per ledger and process: the server's, its provisioner's, and a kernel's own (which
    reaches its slice through its kind's backend: the default kernel handle)."""
    ledger = str(settings.effective_ledger_path())
    backend = _backends.get(ledger)
    if backend is None:
        backend = _backends[ledger] = ToyBackend(settings)
    backend.settings = settings
    return backend


class ToyProvisioner(LocalGPUShareProvisioner):  # type: ignore[misc]
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"][MARK] = self.kernel_id
        return kwargs


def toy_checks(settings: GPUShare, inventory: object) -> Findings:
    return Findings([Check("toy", "OK", "the toy kind answers")], ready=True, simulated=True)


KIND = BackendKind(
    name="toy",
    make_backend=toy_backend,
    provisioner=lambda settings: ToyProvisioner,
    doctor_checks="toy_gpushare:toy_checks",
)
