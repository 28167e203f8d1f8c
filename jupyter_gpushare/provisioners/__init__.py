"""Kernel provisioners registered under ``jupyter_client.kernel_provisioners``."""

from .local import GPUShareProvisioner

__all__ = ["GPUShareProvisioner"]
