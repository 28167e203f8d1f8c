"""What a kernel pod answers to the changes of its slice that only a new pod could make: its GPU
is its pod's for the pod's life, so it cannot give memory back (the panel's release), suspend or
resume."""

from __future__ import annotations

from jupyter_gpushare.backends.kubernetes.backend import HELD_FOR_LIFE
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, NotOfferedError


class HeldForLife:
    """The part of :class:`~.provisioner.KubernetesProvisioner` that refuses, with one error
    (``NotOfferedError``, 409), what a pod does not offer."""

    kernel_id: str

    async def give_back(self) -> None:
        raise NotOfferedError(HELD_FOR_LIFE.format(kernel_id=self.kernel_id))

    async def suspend(self) -> None:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    async def resume(self) -> None:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)


__all__ = ["HeldForLife"]
