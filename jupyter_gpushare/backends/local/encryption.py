"""Whether a local kernel's traffic is encrypted with CurveZMQ, and who decides.

Where other users share the node — through a broker, or a ledger file other users may write —
it must be (with ``c.GPUShare.encrypt``, on by default), so no one else on the box can read it
off the loopback ports. Where nobody else shares it, the kernel manager's own policy decides, as
for any kernelspec: jupyter_client's ``transport_encryption`` (>= 8.10), which a server sets with
``c.MappingKernelManager.transport_encryption`` ("disabled" by default; "auto" encrypts every
kernel whose kernelspec declares CurveZMQ, as gpushare's do).
"""

from __future__ import annotations

import os

from traitlets.config import Config

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import ConfigurationError

POLICY = "transport_encryption"


def encrypts_local_kernels(settings: GPUShare) -> bool:
    """Whether local kernels' traffic must be encrypted: ``encrypt`` is on and other users share
    the node — through a broker, or a ledger file other users may write (group- or
    world-writable, as a ledger shared without a broker must be)."""
    if not settings.encrypt:
        return False
    if settings.effective_broker_url():
        return True
    try:
        return bool(os.stat(settings.effective_ledger_path()).st_mode & 0o022)
    except OSError:
        return False


def policy_setting(manager: object) -> str | None:
    """The configuration line that sets a kernel manager's ``transport_encryption``: in a section
    of its class or of a base class, or of its multi-kernel manager's (a server's
    ``c.MappingKernelManager``), the most specific first; None where nothing sets it."""
    for owner in (manager, getattr(manager, "parent", None)):
        config = getattr(owner, "config", None)
        if not isinstance(config, Config):
            continue
        for cls in type(owner).__mro__:
            if cls.__name__ in config and POLICY in config[cls.__name__]:
                return f"c.{cls.__name__}.{POLICY}"
    return None


def local_encryption(settings: GPUShare, manager: object) -> str | None:
    """The ``transport_encryption`` gpushare-provisioner gives jupyter_client for a local kernel
    of ``manager``: ``"required"`` where other users share the node (a kernel that cannot encrypt
    does not start); None elsewhere, where the manager's own policy applies.

    Raises ConfigurationError, before anything is reserved, where encryption is required and the
    manager's policy is set to "disabled" in its configuration: the two settings contradict each
    other and an administrator must choose. Left at its default, "disabled" is no choice, and
    the node's requirement wins."""
    if not encrypts_local_kernels(settings):
        return None
    if str(getattr(manager, POLICY, "disabled")).lower() == "disabled":
        setting = policy_setting(manager)
        if setting is not None:
            raise ConfigurationError(
                f"c.GPUShare.encrypt requires encrypted kernel traffic where other users share "
                f"the node (a GPU broker or a shared ledger), but {setting} is 'disabled': set it "
                f"to 'auto' or 'required', or c.GPUShare.encrypt = False"
            )
    return "required"


__all__ = ["encrypts_local_kernels", "local_encryption", "policy_setting"]
