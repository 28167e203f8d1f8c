"""gpushare kernelspecs: built from the template in ``kernels/`` (pure), installed through
jupyter_client's KernelSpecManager (I/O)."""

from __future__ import annotations

import copy
import json
import platform
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpushare.core.modes import get_mode
from jupyter_gpushare.core.sizes import parse_size

TEMPLATE_DIRECTORY = "python3-gpu"
DEFAULT_MODE = "timeslice"
LOGO = "logo-svg.svg"  # the launcher's card icon (JupyterLab reads a kernelspec's logo-svg)
# Pads the number of a size in display names to SIZE_DIGITS digits: JupyterLab's launcher orders
# cards by display name as text (localeCompare), where white space sorts before every digit, so a
# padded " 8G" comes before "16G". A hair space is all but invisible.
SORT_SPACE = "\u200a"
SIZE_DIGITS = 3
# debugpy (ipykernel's debugger) warns at every CPython start where frozen modules are on; the
# kernelspec ipykernel installs turns them off with this option, and so does ours.
PYTHON_ARGUMENTS = ["-Xfrozen_modules=off"] if platform.python_implementation() == "CPython" else []


def _resource(name: str) -> str:
    # Installed wheels carry the template inside the package; a source checkout has it at the
    # top-level kernels/ folder that the wheel build copies from.
    packaged = resources.files("jupyter_gpushare") / "kernels" / TEMPLATE_DIRECTORY / name
    if packaged.is_file():
        return packaged.read_text()
    return (Path(__file__).resolve().parents[2] / "kernels" / TEMPLATE_DIRECTORY / name).read_text()


def _template() -> dict[str, Any]:
    return dict(json.loads(_resource("kernel.json")))


def kernelspec_name(size: str | None, mode: str, default_mode: str = DEFAULT_MODE) -> str:
    """``python3-gpu-4g``; ``python3-gpu-4g-vgpu`` for a non-default mode; ``python3-gpu`` for
    the kernelspec that asks for its size (``size`` None)."""
    suffix = "" if mode == default_mode else f"-{mode}"
    if size is None:
        return f"python3-gpu{suffix}"
    slug = re.sub(r"[^a-z0-9]+", "-", size.lower().replace("%", "pct")).strip("-")
    return f"python3-gpu-{slug}{suffix}"


def build_kernelspec(size: str | None, mode: str = DEFAULT_MODE, cores: int | None = None) -> dict[str, Any]:
    """The kernel.json for one preset size and mode (validated; raises with the accepted forms).

    ``size`` None builds "Python 3 (GPU)": no size of its own, JupyterLab's start picker asks
    for one (elsewhere, ``GPUShare.default_memory`` applies). The size's number is padded in
    the display name so that the launcher orders the sizes by size (see SORT_SPACE).
    """
    get_mode(mode)
    spec = copy.deepcopy(_template())
    if size is None:
        label = ""
        memory = None
    else:
        parsed = parse_size(size)
        label = " whole card" if parsed.is_whole else " " + _padded(parsed.text)
        memory = parsed.text
    if mode != DEFAULT_MODE:
        label = f"{label}, {mode}"
    spec["display_name"] = spec["display_name"].replace("{label}", label)
    spec["argv"][1:1] = PYTHON_ARGUMENTS
    config = spec["metadata"]["kernel_provisioner"]["config"]
    config["gpu_memory"] = memory
    config["gpu_mode"] = mode
    config["gpu_cores"] = cores
    return spec


def _padded(text: str) -> str:
    whole = len(re.match(r"\d*", text).group())  # type: ignore[union-attr]
    return SORT_SPACE * max(0, SIZE_DIGITS - whole) + text if whole else text


PICKER_NAME = "python3-gpu"  # "Python 3 (GPU)" in the default mode: its size picked at each start


def kernels_directory(user: bool = False, prefix: str | None = None) -> Path:
    """Where ``install_kernel_spec`` puts kernelspecs for these options (as jupyter_client does)."""
    if user:
        return Path(KernelSpecManager().user_kernel_dir)
    if prefix:
        return Path(prefix).absolute() / "share" / "jupyter" / "kernels"
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH

    return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels"


def hidden_by(name: str, directory: Path) -> list[Path]:
    """The kernelspecs named ``name`` that one in ``directory`` hides from this user: those in
    the directories Jupyter looks in after it (none where it is not on Jupyter's path at all)."""
    searched = [Path(entry).resolve() for entry in KernelSpecManager().kernel_dirs]
    here = directory.resolve()
    if here not in searched:
        return []
    later = searched[searched.index(here) + 1 :]
    return [entry / name for entry in later if (entry / name / "kernel.json").is_file()]


def install_kernelspecs(
    sizes: list[str],
    mode: str = DEFAULT_MODE,
    *,
    user: bool = False,
    prefix: str | None = None,
    asking: bool = False,
) -> list[tuple[str, str]]:
    """Install one kernelspec per size, and with ``asking`` first "Python 3 (GPU)", whose size
    is picked at each start; returns ``(name, directory)`` pairs.

    Every size is validated before anything is written, so a typo installs nothing.
    """
    chosen: list[str | None] = [None] if asking else []
    specs = [(kernelspec_name(size, mode), build_kernelspec(size, mode)) for size in [*chosen, *sizes]]
    manager = KernelSpecManager()
    installed = []
    for name, spec in specs:
        with tempfile.TemporaryDirectory() as staging:
            (Path(staging) / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
            # The copy keeps the staging directory's mode (0700): every user must read a
            # kernelspec installed for the system or a shared environment.
            Path(staging).chmod(0o755)
            (Path(staging) / LOGO).write_text(_resource(LOGO))
            destination = manager.install_kernel_spec(staging, kernel_name=name, user=user, prefix=prefix)
        installed.append((name, destination))
    return installed
