"""A third backend kind, ``toy``, as another package would add one (docs/development.md, "Adding
a backend"); tests/integration/test_toy_backend.py installs it beside jupyter_gpushare and starts a
kernel through it.

It registers a :class:`~jupyter_gpushare.backends.registry.BackendKind` under the entry-point
group ``jupyter_gpushare.backends`` (the test writes the distribution's ``entry_points.txt``).
Its slices are the node ledger's, as the local kind's are; what is its own is its name, the pool
it reports under that name, the provisioner that marks its kernels, and a doctor check.
"""

from __future__ import annotations

import functools
from typing import Any

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.local.provisioner import LocalGPUShareProvisioner
from jupyter_gpushare.backends.registry import BackendKind
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.findings import Check, Findings
from jupyter_gpushare.payloads import PoolPayload

MARK = "TOY_GPUSHARE_KERNEL"  # what its provisioner adds to a kernel's environment


class ToyBackend(LocalBackend):
    name = "toy"

    def pool(self) -> PoolPayload:
        pool = super().pool()
        pool["backend"] = self.name
        return pool


@functools.cache
def _backend(ledger: str) -> ToyBackend:
    return ToyBackend(GPUShare(backend="toy", ledger_path=ledger))


def toy_backend(settings: GPUShare) -> ToyBackend:
    backend = _backend(str(settings.effective_ledger_path()))
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
