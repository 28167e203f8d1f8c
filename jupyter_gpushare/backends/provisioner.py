"""Kernel provisioners registered under ``jupyter_client.kernel_provisioners``.

``gpushare-provisioner`` is :class:`GPUShareProvisioner`; constructing it builds the provisioner
of the configured backend (``c.GPUShare.backend``), as its kind in
:mod:`jupyter_gpushare.backends.registry` names it: local processes or Kubernetes pods — pods the
server creates itself, or pods the GPU broker creates for it (``c.GPUShare.broker_url``). Each is
a :class:`~jupyter_gpushare.backends.provisioning.SliceProvisioner`.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyter_gpushare.backends.provisioning import SliceProvisioner
from jupyter_gpushare.backends.registry import kind_for
from jupyter_gpushare.config import load_settings, unreported_warnings
from jupyter_gpushare.core.errors import ConfigurationError


def backend_class(parent: Any) -> type[SliceProvisioner]:
    """The provisioner class of the configured backend, as its kind in the registry names it."""
    settings = load_settings(getattr(parent, "config", None), reconcile=False)
    # A user's setting an administrator's file overrules: said once per process, in the log of
    # whatever starts the kernel (a server, jupyter console, nbconvert).
    log = getattr(parent, "log", None) or logging.getLogger("jupyter_gpushare")
    for sentence in unreported_warnings(settings):
        log.warning("jupyter_gpushare: %s", sentence)
    bypassed = settings.settled.broker_bypassed() if settings.settled else None
    if bypassed:
        raise ConfigurationError(bypassed)
    return kind_for(settings).provisioner(settings)


class GPUShareProvisioner(SliceProvisioner):  # type: ignore[misc]
    """The ``gpushare-provisioner`` entry point: one name, the kernel's kind chosen by configuration.

    Kernelspecs name one provisioner whatever runs the kernels. Constructing this class (as
    jupyter_client's provisioner factory does, with the kernel manager as ``parent``) reads
    ``c.GPUShare.backend`` from the parent's config (or the config files, or
    ``$JUPYTER_GPUSHARE_BACKEND``) and returns that backend's provisioner, built with the same
    arguments; it is never an instance of this class itself.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # The kind's instance is not one of ours, so Python does not run __init__ on it again.
        return backend_class(kwargs.get("parent"))(*args, **kwargs)


__all__ = ["GPUShareProvisioner", "SliceProvisioner", "backend_class"]
