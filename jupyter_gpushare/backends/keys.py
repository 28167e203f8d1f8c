"""What slices are keyed by, the same for every backend and the broker: a digest of a kernel's
token (the token itself is never stored) and the id of the server that started a kernel."""

from __future__ import annotations

import hashlib
import socket


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def server_id_of(owner: str, pid: int) -> str:
    """The id of the server (or console, or nbclient run) in process ``pid`` on this node."""
    return f"{owner}@{socket.gethostname()}:{pid}"


__all__ = ["server_id_of", "token_digest"]
