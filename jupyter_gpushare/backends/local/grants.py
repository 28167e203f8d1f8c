"""What a local kernel gets with its slice, and how it proves the slice is its own.

:class:`KernelGrants` is the part of :class:`~.backend.LocalBackend` that turns a ledger record into
the kernel's environment (its mode's device and caps, this process's settings, its own-slice
token) and checks a kernel's token against the slice it claims.
"""

from __future__ import annotations

import hmac

from jupyter_gpushare.backends.keys import token_digest
from jupyter_gpushare.backends.local import views as local_views
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.config import GPUShare, settings_env
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import NotYourSliceError
from jupyter_gpushare.core.modes import Grant, NodeFacts, get_mode
from jupyter_gpushare.core.records import SliceRecord


class KernelGrants:
    settings: GPUShare
    ledger: Ledger
    facts: NodeFacts
    # The secret each kernel started here proves its identity with (kept only in memory).
    _tokens: dict[str, str]

    def grant(self, record: SliceRecord) -> Grant:
        assert record.unit_uuid is not None
        return Grant(
            kernel_id=record.kernel_id,
            mode=record.mode,
            unit_uuid=record.unit_uuid,
            unit_memory=local_views.unit_memory(self.ledger.devices(), record.unit_uuid),
            memory=record.memory,
            cores=record.cores,
        )

    def slice_env(self, record: SliceRecord) -> dict[str, str]:
        """The variables of the slice's mode on this node (device, caps, MPS or HAMi-core)."""
        return get_mode(record.mode).kernel_env(self.grant(record), self.facts)

    def kernel_env(self, record: SliceRecord) -> dict[str, str]:
        """The slice's variables, this process's settings, and the kernel's own-slice token."""
        env = settings_env(self.settings)
        env.update(self.slice_env(record))
        token = self._tokens.get(record.kernel_id)
        if token:
            env[env_names.TOKEN] = token
        return env

    def own_slice(self, kernel_id: str, token: str | None) -> SliceRecord | None:
        """The slice of ``kernel_id`` if ``token`` proves the caller is that kernel.

        None when the kernel holds no slice; an error when the slice exists and the token does
        not match it, so one kernel can never act on another kernel's slice.
        """
        record = self.ledger.get(kernel_id)
        if record is None:
            return None
        if (
            not token
            or record.token_hash is None
            or not hmac.compare_digest(record.token_hash, token_digest(token))
        ):
            raise NotYourSliceError(f"the GPU slice of kernel {kernel_id} belongs to another kernel")
        return record

    def own_warnings(self, kernel_id: str, token: str | None) -> tuple[str, ...]:
        """The warnings on the caller's slice (none without one, or with another kernel's token)."""
        try:
            record = self.own_slice(kernel_id, token)
        except NotYourSliceError:
            return ()
        return record.warnings if record is not None else ()

    def token_for(self, kernel_id: str) -> str | None:
        return self._tokens.get(kernel_id)

    def remember_token(self, kernel_id: str, token: str) -> None:
        """Let a kernel that requests its own slice keep proving its identity with ``token``."""
        self._tokens[kernel_id] = token


__all__ = ["KernelGrants"]
