"""The container toolkit's stand-in on the real node: an OCI runtime wrapper around runc that
gives a container asking for NVIDIA devices the (simulated) driver's NVML library.

On a GPU node, NVIDIA's container toolkit (``nvidia-container-runtime``, an OCI runtime that
containerd's runc shim runs in runc's place) edits the bundle's ``config.json`` of a container
whose environment has ``NVIDIA_VISIBLE_DEVICES`` (not ``void``, ``none`` or empty) before runc
creates it: it mounts the driver's libraries, ``libnvidia-ml.so.1`` among them, and the devices
named. This does the same with the simulated driver (tests/support/nvml_sim), whose library
serves only the cards that variable names (libnvidia-ml.c's header): on ``create`` it adds
read-only bind mounts of

* the library, at :data:`CONTAINER_LIBRARY` (a directory glibc's loader searches without a
  cache in a Debian image: ``/usr/lib/x86_64-linux-gnu`` is one of its system directories, so no
  ``ldconfig`` hook is needed, where the toolkit runs one), and
* the **directory** holding the NVML state file, at :data:`CONTAINER_STATE_DIRECTORY` (the state
  is replaced by a rename, and a file bind-mounted alone would keep showing the old inode),

sets ``GPUSHARE_NVML_STATE`` in the process's environment to the state's path in there, and runs
the real runc with the arguments it was given, unchanged. Every other call (and a container that
asks no device: the pause sandbox, busybox pods) goes to runc untouched. No ``/dev/nvidia*`` node
is mounted: the simulated cards have none.

Where it finds the library, the state and runc: a JSON file (:func:`install` writes it beside the
launcher, ``nvidia-runtime.json``), named by ``--config`` before ``--``; the launcher
(``nvidia-container-runtime``, a shell script :func:`install` writes) is what containerd runs as
the runc options' ``BinaryName`` (:func:`containerd_options`). The script runs with the machine's
``/usr/bin/python3`` and the standard library only: containerd's shim runs it outside any virtual
environment. Its state directory is mounted into every GPU container: keep it for the state alone
(:func:`install` refuses a directory holding anything else).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTAINER_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
CONTAINER_STATE_DIRECTORY = "/run/nvidia-sim"
STATE_VARIABLE = "GPUSHARE_NVML_STATE"  # what tests/support/nvml_sim's library reads
DEVICES_VARIABLE = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICE = ("void", "none", "")  # what the toolkit takes for a container without a GPU
READ_ONLY = ["bind", "ro", "nosuid", "nodev"]
CONFIG_NAME = "nvidia-runtime.json"
LAUNCHER_NAME = "nvidia-container-runtime"
# runc's global options that take a value (runc --help): the command is the first word after them.
GLOBAL_VALUES = ("log", "log-format", "root", "criu", "rootless")
CREATING = ("create", "run")  # the commands that make a container from a bundle


class WrapperError(Exception):
    """The wrapper cannot do what the container asks: runc is not run, and the shim says why."""


@dataclass(frozen=True)
class NvidiaRuntime:
    """What the wrapper mounts: the simulated driver's library (``DriverRoot.library``) and the
    NVML state file (alone in its directory); ``runc``, the runtime it wraps."""

    library: Path
    state: Path
    runc: str = "runc"

    def install(self, directory: Path) -> Path:
        """Write the wrapper's configuration and its launcher into ``directory``; the launcher's
        path, for :func:`containerd_options`."""
        self.state.parent.mkdir(parents=True, exist_ok=True)  # mounted: it must exist, the state need not yet
        # Entered by a container's user, whoever it is (a test's temporary directories are 0700).
        self.state.parent.chmod(0o755)
        others = [p.name for p in self.state.parent.iterdir() if not _is_state(p.name, self.state.name)]
        if others:
            raise ValueError(
                f"{self.state.parent} is mounted into every GPU container, so it must hold the "
                f"NVML state alone, and it also holds {', '.join(sorted(others))}"
            )
        runc = shutil.which(self.runc)
        if runc is None:
            raise ValueError(f"runc ({self.runc}) is not on PATH: install Debian's runc")
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / CONFIG_NAME
        values = {"runc": runc, "library": str(self.library.resolve()), "state": str(self.state.absolute())}
        config.write_text(json.dumps(values, indent=2) + "\n")
        launcher = directory / LAUNCHER_NAME
        launcher.write_text(
            "#!/bin/sh\n"
            "# NVIDIA's container runtime's stand-in (tests/cluster/nvidia_runtime.py): runc's arguments\n"
            "# go after --, unchanged.\n"
            f'exec /usr/bin/python3 -I "{Path(__file__).resolve()}" --config "{config}" -- "$@"\n'
        )
        launcher.chmod(0o755)
        return launcher


def containerd_options(launcher: Path) -> str:
    """The line of the runc runtime's options (``[...runtimes.runc.options]`` of containerd's
    CRI plugin) that makes containerd's shim run ``launcher`` in runc's place."""
    return f'  BinaryName = "{launcher}"\n'


def _is_state(name: str, state: str) -> bool:
    # The state, or one being written (nvml_sim's write_state: a temporary ".<name>.*" renamed over it).
    return name == state or name.startswith(f".{state}.")


# ---- the pure half: runc's command line and the bundle's spec --------------------------------------


def bundle_of(args: Sequence[str], cwd: str) -> str | None:
    """The bundle directory of a runc command line that creates a container (``--bundle``/``-b``,
    else the working directory, as runc takes it); None for every other command."""
    index = 0
    while index < len(args) and args[index].startswith("-"):
        flag = args[index].lstrip("-")  # runc's flag library takes -root as --root
        index += 2 if flag in GLOBAL_VALUES else 1  # "--root=DIR" is one word
    if index >= len(args) or args[index] not in CREATING:
        return None
    rest = args[index + 1 :]
    for position, arg in enumerate(rest):
        if arg == "--":
            break
        if arg in ("--bundle", "-b", "-bundle") and position + 1 < len(rest):
            return rest[position + 1]
        for prefix in ("--bundle=", "-b=", "-bundle="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
    return cwd


def visible_devices(env: Sequence[str]) -> str | None:
    """The value of ``NVIDIA_VISIBLE_DEVICES`` in an OCI process's environment (the last one, as
    runc leaves the process), or None."""
    found = None
    for entry in env:
        name, _, value = entry.partition("=")
        if name == DEVICES_VARIABLE:
            found = value
    return found


def with_nvml(spec: Mapping[str, Any], library: str, state: str) -> dict[str, Any] | None:
    """``spec`` (an OCI runtime spec) as the toolkit would have the container created: the
    library and the state's directory mounted read-only, ``GPUSHARE_NVML_STATE`` naming the state
    in there. None where the container asks for no device (nothing to change)."""
    process = spec.get("process") or {}
    env = list(process.get("env") or [])
    visible = visible_devices(env)
    if visible is None or visible.strip() in NO_DEVICE:
        return None
    state_path = Path(state)
    mounts = [
        {"destination": CONTAINER_LIBRARY, "type": "bind", "source": library, "options": READ_ONLY},
        {
            "destination": CONTAINER_STATE_DIRECTORY,
            "type": "bind",
            "source": str(state_path.parent),
            "options": READ_ONLY,
        },
    ]
    ours = {mount["destination"] for mount in mounts}
    env = [entry for entry in env if entry.partition("=")[0] != STATE_VARIABLE]
    env.append(f"{STATE_VARIABLE}={CONTAINER_STATE_DIRECTORY}/{state_path.name}")
    edited = dict(spec)
    edited["process"] = {**process, "env": env}
    kept = [mount for mount in spec.get("mounts") or [] if mount.get("destination") not in ours]
    edited["mounts"] = [*kept, *mounts]
    return edited


# ---- the wrapper ---------------------------------------------------------------------------------


def prepare(args: Sequence[str], config: Mapping[str, str], cwd: str) -> None:
    """Edit the bundle's ``config.json`` where ``args`` create a container that asks for devices."""
    bundle = bundle_of(args, cwd)
    if bundle is None:
        return
    path = Path(cwd, bundle) / "config.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WrapperError(f"cannot read the bundle's spec {path}: {error}") from error
    edited = with_nvml(spec, config["library"], config["state"])
    if edited is None:
        return
    partial = path.with_name(".config.json.nvidia-runtime")
    partial.write_text(json.dumps(edited))
    os.chmod(partial, path.stat().st_mode & 0o7777)
    os.replace(partial, path)  # runc reads the old spec or the new one, never half


def main(argv: Sequence[str]) -> int:
    """``--config FILE -- RUNC-ARGS...``: prepare the bundle, then become runc."""
    if len(argv) < 3 or argv[0] != "--config" or argv[2] != "--":
        print("usage: nvidia_runtime.py --config FILE -- RUNC-ARGUMENTS...", file=sys.stderr)
        return 2
    try:
        config = json.loads(Path(argv[1]).read_text())
        args = list(argv[3:])
        prepare(args, config, os.getcwd())
    except (OSError, ValueError, KeyError, WrapperError) as error:
        print(f"nvidia-container-runtime (simulated): {error}", file=sys.stderr)
        return 1
    os.execv(config["runc"], [config["runc"], *args])
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
