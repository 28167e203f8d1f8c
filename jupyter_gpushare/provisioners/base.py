"""The ``gpushare-provisioner`` entry point: one name, the backend chosen by configuration.

Kernelspecs name one provisioner whatever runs the kernels. Constructing
:class:`GPUShareProvisioner` (as jupyter_client's provisioner factory does, with the kernel
manager as ``parent``) reads ``c.GPUShare.backend`` from the parent's config (or the config
files, or ``$JUPYTER_GPUSHARE_BACKEND``) and builds the backend's provisioner instead: a local
process (:mod:`.local`) or a Kubernetes pod (:mod:`.kubernetes`). Both are instances of this
class, so ``isinstance(km.provisioner, GPUShareProvisioner)`` tells a gpushare kernel.
"""

from __future__ import annotations

from typing import Any

from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from ..config import load_settings


class GPUShareProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """A kernel holding a GPU slice; which kind of kernel depends on ``GPUShare.backend``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is GPUShareProvisioner:
            cls = backend_class(kwargs.get("parent"))
        return super().__new__(cls, *args, **kwargs)

    def forget_failed_start(self) -> None:
        """Drop this kernel from its multi-kernel manager's pending starts after a failed start.

        jupyter_client keeps a kernel whose start raised (a slice that does not fit, a pod the
        cluster cannot place) in ``MultiKernelManager._pending_kernels`` for ever, and a server's
        shutdown then waits on it. A refused GPU request must not cost a hung shutdown; there is
        no public call for this, hence the private attribute (absent: nothing to do).
        """
        manager = getattr(self.parent, "parent", None)
        pending = getattr(manager, "_pending_kernels", None)
        if isinstance(pending, dict):
            pending.pop(self.kernel_id, None)


def backend_class(parent: Any) -> type[GPUShareProvisioner]:
    """The provisioner class of the configured backend."""
    settings = load_settings(getattr(parent, "config", None), reconcile=False)
    if settings.backend == "kubernetes":
        from .kubernetes import KubernetesProvisioner

        return KubernetesProvisioner
    from .local import LocalGPUShareProvisioner

    return LocalGPUShareProvisioner
