"""One local backend per process and settings: NVML is probed and the ledger opened once, not
per start, and a forked child builds its own."""

from __future__ import annotations

import os
from dataclasses import dataclass

from jupyter_gpushare.backends.local.backend import LocalBackend
from jupyter_gpushare.config import GPUShare


@dataclass(frozen=True)
class BackendKey:
    """The settings that make two local backends the same; one per key per process."""

    ledger_path: str
    simulate: str
    libvgpu_path: str
    mps_pipe_directory: str


_backends: dict[BackendKey, LocalBackend] = {}


def local_backend(settings: GPUShare) -> LocalBackend:
    """The process's local backend for these settings (NVML is probed once, not per start)."""
    key = BackendKey(
        str(settings.effective_ledger_path()),
        settings.effective_simulate(),
        settings.libvgpu_path,
        settings.mps_pipe_directory,
    )
    backend = _backends.get(key)
    if backend is None or backend.holder.pid != os.getpid():
        backend = _backends[key] = LocalBackend(settings)
    else:
        backend.settings = settings  # policy traits may differ between callers; follow the latest
    return backend


__all__ = ["BackendKey", "local_backend"]
