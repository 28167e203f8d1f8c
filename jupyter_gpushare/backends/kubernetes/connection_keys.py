"""A kernel pod's connection keys: its messages' signing key and, where ``c.GPUShare.encrypt`` is
on, its CurveZMQ key pair. Made once per kernel and kept across its restarts (each a new pod),
as a local kernel keeps its connection file."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from jupyter_gpushare.core.errors import ConfigurationError


@dataclass
class ConnectionKeys:
    key: str = field(default_factory=lambda: secrets.token_hex(32))
    curve: tuple[str, str] | None = None  # (public, secret), Z85

    def curve_for(self, encrypt: bool) -> tuple[str, str] | None:
        """The CurveZMQ pair of a start with ``encrypt`` (made at the first such start), else None."""
        if not encrypt:
            self.curve = None
        elif self.curve is None:
            self.curve = new_curve_keypair()
        return self.curve


def new_curve_keypair() -> tuple[str, str]:
    """A new CurveZMQ (public, secret) pair, Z85; a clear error where pyzmq cannot make one."""
    import zmq  # only where encryption is on

    if not zmq.has("curve"):
        raise ConfigurationError(
            "c.GPUShare.encrypt is on but this pyzmq has no CurveZMQ support (libzmq built "
            "without libsodium): install a pyzmq wheel with it, or set c.GPUShare.encrypt = False"
        )
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


__all__ = ["ConnectionKeys", "new_curve_keypair"]
