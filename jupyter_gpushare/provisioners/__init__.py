"""Kernel provisioners registered under ``jupyter_client.kernel_provisioners``.

``gpushare-provisioner`` is :class:`GPUShareProvisioner`; constructing it builds the provisioner
of the configured backend (``c.GPUShare.backend``): local processes or Kubernetes pods.
"""

from .base import GPUShareProvisioner

__all__ = ["GPUShareProvisioner"]
