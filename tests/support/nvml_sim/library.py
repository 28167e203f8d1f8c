"""Builds libnvidia-ml.so.1 from libnvidia-ml.c with gcc, once per source, and says where it is.

The library is kept as ``build/nvml/<hash>/usr/lib64/libnvidia-ml.so.1``: a directory laid out as
a driver root (what NVIDIA's device plugin searches below its ``--driver-root-ctr-path``), under a
hash of the source and the compiler flags, so an edit rebuilds and an unchanged source never does
(a build takes about a second).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "libnvidia-ml.c"
REPOSITORY = Path(__file__).resolve().parents[3]
BUILDS = REPOSITORY / "build" / "nvml"
LIBRARY_NAME = "libnvidia-ml.so.1"
READABLE = 0o755
STATE_VARIABLE = "GPUSHARE_NVML_STATE"  # the environment variable naming the state file
# The soname is what lets dlopen("libnvidia-ml.so.1") find this library once it is loaded.
FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden",
         f"-Wl,-soname,{LIBRARY_NAME}", "-pthread")  # fmt: skip


@dataclass(frozen=True)
class DriverRoot:
    """Where the built library is: a driver root, and the library inside it."""

    root: Path

    @property
    def library_directory(self) -> Path:
        return self.root / "usr" / "lib64"

    @property
    def library(self) -> Path:
        return self.library_directory / LIBRARY_NAME

    def environment(self, state: Path) -> dict[str, str]:
        """What a process needs to load this library by its name and serve ``state``."""
        return {"LD_LIBRARY_PATH": str(self.library_directory), STATE_VARIABLE: str(state)}


def _digest() -> str:
    sha = hashlib.sha256(SOURCE.read_bytes())
    sha.update("\0".join(FLAGS).encode())
    return sha.hexdigest()[:12]


def driver_root() -> DriverRoot:
    """The driver root holding the library for the current source, built first when missing."""
    built = DriverRoot(BUILDS / _digest())
    if built.library.exists():
        if built.library.stat().st_mode & 0o777 != READABLE:  # built before the mode was set
            built.library.chmod(READABLE)
        return built
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("the simulated NVML library is built with gcc, which is not on PATH: install gcc")
    built.library_directory.mkdir(parents=True, exist_ok=True)
    # Built beside its place and renamed into it: a concurrent test run never loads half a file.
    with tempfile.NamedTemporaryFile(dir=built.library_directory, suffix=".partial", delete=False) as partial:
        pass
    try:
        subprocess.run(
            [gcc, *FLAGS, "-o", partial.name, str(SOURCE)], check=True, capture_output=True, text=True
        )
        # A driver's library is every user's: a kernel container runs as its image's user, and
        # the temporary file was made for its owner alone.
        os.chmod(partial.name, READABLE)
        os.replace(partial.name, built.library)
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"gcc could not build {SOURCE.name}: {error.stderr.strip()}") from error
    finally:
        Path(partial.name).unlink(missing_ok=True)
    for stale in BUILDS.iterdir():
        if stale != built.root:
            shutil.rmtree(stale, ignore_errors=True)  # an older source's build
    return built


def load_into_pynvml(pynvml: Any, root: DriverRoot) -> None:
    """Make the real ``pynvml`` module of this process call the simulated library.

    pynvml loads ``libnvidia-ml.so.1`` by name, through the dynamic loader's search path, which a
    running process cannot change; this loads the library by its path, and hands it to pynvml as
    the one it would have found (a process started with ``root.environment`` finds it itself).
    A process has one NVML library: once loaded, pynvml keeps it.
    """
    library = ctypes.CDLL(str(root.library), mode=ctypes.RTLD_GLOBAL)
    with pynvml.libLoadLock:
        loaded = pynvml.nvmlLib
        if loaded is not None and Path(loaded._name).resolve() != root.library.resolve():
            raise RuntimeError(f"this process already loaded another NVML library: {loaded._name}")
        pynvml.nvmlLib = library
