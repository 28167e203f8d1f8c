"""The ``gpushare-provisioner`` entry point of ``jupyter_client.kernel_provisioners``.

Kernelspecs name one provisioner whatever runs the kernels. jupyter_client's provisioner factory
loads the entry point and calls it with ``kernel_id``, ``kernel_spec``, ``parent`` (the kernel
manager) and the kernelspec's provisioner config; it asks nothing else of it, so the entry point
is :func:`gpushare_provisioner`, a factory: it reads ``c.GPUShare.backend`` from the parent's
config (or the config files, or ``$JUPYTER_GPUSHARE_BACKEND``) and builds the provisioner its
kind in :mod:`jupyter_gpushare.backends.registry` names — local processes, or Kubernetes pods
(pods the server creates itself, or pods the GPU broker creates for it with
``c.GPUShare.broker_url``). Each is a
:class:`~jupyter_gpushare.backends.provisioning.SliceProvisioner`.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyter_gpushare.backends.provisioning import SliceProvisioner
from jupyter_gpushare.backends.registry import kind_for
from jupyter_gpushare.config import load_settings, unreported_warnings
from jupyter_gpushare.core.errors import ConfigurationError


def provisioner_class(parent: Any) -> type[SliceProvisioner]:
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


def gpushare_provisioner(**kwargs: Any) -> SliceProvisioner:
    """The ``gpushare-provisioner`` entry point: the configured kind's provisioner, built with
    the arguments jupyter_client's factory passes (``parent``, the kernel manager, among them)."""
    return provisioner_class(kwargs.get("parent"))(**kwargs)


__all__ = ["SliceProvisioner", "gpushare_provisioner", "provisioner_class"]
