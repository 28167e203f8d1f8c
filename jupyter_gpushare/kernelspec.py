"""gpushare kernelspecs: built from the template in ``kernels/`` (pure), installed through
jupyter_client's KernelSpecManager (I/O)."""

from __future__ import annotations

import copy
import json
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from .modes import get_mode
from .sizes import parse_size

TEMPLATE_DIRECTORY = "python3-gpu"
DEFAULT_MODE = "timeslice"


def _template() -> dict[str, Any]:
    # Installed wheels carry the template inside the package; a source checkout has it at the
    # top-level kernels/ folder that the wheel build copies from.
    packaged = resources.files("jupyter_gpushare") / "kernels" / TEMPLATE_DIRECTORY / "kernel.json"
    if packaged.is_file():
        return dict(json.loads(packaged.read_text()))
    source = Path(__file__).resolve().parent.parent / "kernels" / TEMPLATE_DIRECTORY / "kernel.json"
    return dict(json.loads(source.read_text()))


def kernelspec_name(size: str, mode: str, default_mode: str = DEFAULT_MODE) -> str:
    """``python3-gpu-4g``; ``python3-gpu-4g-vgpu`` for a non-default mode."""
    slug = re.sub(r"[^a-z0-9]+", "-", size.lower().replace("%", "pct")).strip("-")
    suffix = "" if mode == default_mode else f"-{mode}"
    return f"python3-gpu-{slug}{suffix}"


def build_kernelspec(size: str, mode: str = DEFAULT_MODE, cores: int | None = None) -> dict[str, Any]:
    """The kernel.json for one preset size and mode (validated; raises with the accepted forms)."""
    parsed = parse_size(size)
    get_mode(mode)
    spec = copy.deepcopy(_template())
    label = "whole card" if parsed.is_whole else parsed.text
    if mode != DEFAULT_MODE:
        label = f"{label}, {mode}"
    spec["display_name"] = spec["display_name"].replace("{size}", label)
    config = spec["metadata"]["kernel_provisioner"]["config"]
    config["gpu_memory"] = parsed.text
    config["gpu_mode"] = mode
    config["gpu_cores"] = cores
    return spec


def install_kernelspecs(
    sizes: list[str],
    mode: str = DEFAULT_MODE,
    *,
    user: bool = False,
    prefix: str | None = None,
) -> list[tuple[str, str]]:
    """Install one kernelspec per size; returns ``(name, directory)`` pairs.

    Every size is validated before anything is written, so a typo installs nothing.
    """
    specs = [(kernelspec_name(size, mode), build_kernelspec(size, mode)) for size in sizes]
    manager = KernelSpecManager()
    installed = []
    for name, spec in specs:
        with tempfile.TemporaryDirectory() as staging:
            (Path(staging) / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
            # The copy keeps the staging directory's mode (0700): every user must read a
            # kernelspec installed for the system or a shared environment.
            Path(staging).chmod(0o755)
            destination = manager.install_kernel_spec(staging, kernel_name=name, user=user, prefix=prefix)
        installed.append((name, destination))
    return installed
