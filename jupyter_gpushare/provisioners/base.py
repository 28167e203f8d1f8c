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


def backend_class(parent: Any) -> type[GPUShareProvisioner]:
    """The provisioner class of the configured backend."""
    settings = load_settings(getattr(parent, "config", None), reconcile=False)
    if settings.backend == "kubernetes":
        from .kubernetes import KubernetesProvisioner

        return KubernetesProvisioner
    from .local import LocalGPUShareProvisioner

    return LocalGPUShareProvisioner
