"""NVIDIA's device plugin (github.com/NVIDIA/k8s-device-plugin), built unmodified from its Go
module, and how it runs over the simulated NVML (tests/support/nvml_sim).

``python -m tests.cluster.nvidia_device_plugin`` prints the plugin's and the stub's paths, building them
first when missing (``make deviceplugin`` runs this). deviceplugin/go.mod requires the plugin's
module at the version we test and names its command as a ``tool``; nothing of NVIDIA's source is
copied or patched, and the build list is the plugin's own (no other module raises a version).
The same module holds ``kubeletstub``, the kubelet's half of the device plugin API for the tests
that check the plugin alone. Binaries are kept as
``build/cluster/bin/nvidia-device-plugin-<version>-<hash>`` (and ``kubeletstub-<hash>``): the hash
of deviceplugin/'s module files and Go sources, so an edit rebuilds and an unchanged tree never
does.

How it runs (:func:`start`, with :func:`environment` and :func:`command`): the library is found through
``LD_LIBRARY_PATH`` and ``DRIVER_ROOT_CTR_PATH`` (the plugin loads ``libnvidia-ml.so.1`` below
that driver root; go-nvlib's platform check loads it by name); the simulated cards come from the
state file in ``GPUSHARE_NVML_STATE``; the device list goes to containers as
``NVIDIA_VISIBLE_DEVICES`` (``DEVICE_LIST_STRATEGY=envvar``, UUIDs); sharing comes from the
plugin's own config file (``CONFIG_FILE``, :func:`write_config`). Nothing is
disabled: health checks run on the library's event calls, and ``PASS_DEVICE_SPECS`` stays off
(its default) so no /dev/nvidia* node is asked of the runtime. The plugin serves its socket in
/var/lib/kubelet/device-plugins/ (a fixed path in v0.17: only the kubelet's socket has a flag);
a test that runs it without the real node gives it a private mount namespace where that
directory is the test's own (``socket_directory``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.build import BINARIES, go_environment
from tests.support.nvml_sim import DriverRoot

SOURCE = Path(__file__).resolve().parent / "deviceplugin"
PLUGIN_PACKAGE = "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")


@dataclass(frozen=True)
class Binaries:
    plugin: Path  # NVIDIA's nvidia-device-plugin
    kubelet_stub: Path  # deviceplugin/kubeletstub


def version() -> str:
    """The k8s-device-plugin version deviceplugin/go.mod requires (``v0.17.4``)."""
    found = re.search(r"github\.com/NVIDIA/k8s-device-plugin\s+(v\S+)", (SOURCE / "go.mod").read_text())
    if found is None:
        raise RuntimeError("deviceplugin/go.mod requires no github.com/NVIDIA/k8s-device-plugin version")
    return found.group(1)


def _digest() -> str:
    sha = hashlib.sha256()
    for path in [SOURCE / "go.mod", SOURCE / "go.sum", *sorted(SOURCE.rglob("*.go"))]:
        sha.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:12]


def _binaries() -> Binaries:
    digest = _digest()
    plugin = os.environ.get("NVIDIA_DEVICE_PLUGIN")  # another build, e.g. of another version
    return Binaries(
        plugin=Path(plugin) if plugin else BINARIES / f"nvidia-device-plugin-{version()}-{digest}",
        kubelet_stub=BINARIES / f"kubeletstub-{digest}",
    )


def build(log: object = sys.stderr) -> Binaries:
    """The binaries for the current module files, built first when missing (cold: a minute or
    two of downloads and compiling; cgo, so gcc too). ``$NVIDIA_DEVICE_PLUGIN``, when set, is
    the plugin binary instead of ours."""
    binaries = _binaries()
    wanted = [
        (binaries.plugin, PLUGIN_PACKAGE, "nvidia-device-plugin-"),
        (binaries.kubelet_stub, "./kubeletstub", "kubeletstub-"),
    ]
    missing = [(target, package, prefix) for target, package, prefix in wanted if not target.exists()]
    if not missing:
        return binaries
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "NVIDIA's device plugin is built with Go (1.24 or newer), which is not on PATH: install Go, "
            "then run `make deviceplugin`"
        )
    BINARIES.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    names = ", ".join(target.name for target, _, _ in missing)
    print(f"building {names} (NVIDIA's device plugin {version()}; cold: minutes)…", file=log)
    for target, package, prefix in missing:
        partial = target.with_name(target.name + ".partial")
        # -s -w: no symbol table or DWARF, a third smaller, and linking needs less memory.
        command = [go, "build", "-ldflags=-s -w", "-o", str(partial), package]
        subprocess.run(command, cwd=SOURCE, env={**go_environment(), "CGO_ENABLED": "1"}, check=True)
        partial.rename(target)
        for stale in BINARIES.glob(prefix + "*"):
            if stale != target:
                stale.unlink(missing_ok=True)  # an older build of the same binary
    elapsed = time.monotonic() - started
    print(f"built {names} in {elapsed:.0f} s", file=log)
    return binaries


def find() -> Binaries:
    """The built binaries; fails with what to run when they are missing."""
    binaries = _binaries()
    for binary in (binaries.plugin, binaries.kubelet_stub):
        if not binary.exists():
            raise FileNotFoundError(
                f"NVIDIA's device plugin is not built ({binary.name} is missing under {binary.parent}): "
                "run `make deviceplugin` (a cold build takes minutes)"
            )
    return binaries


def write_config(
    path: Path, time_slicing_replicas: int | None = None, resource: str = "nvidia.com/gpu"
) -> Path:
    """The plugin's own config file: every card of ``resource`` shared by
    ``time_slicing_replicas`` containers, or (None) whole cards."""
    text = "version: v1\n"
    if time_slicing_replicas is not None:
        if time_slicing_replicas < 2:
            raise ValueError(
                f"time-slicing shares a card between 2 or more replicas, not {time_slicing_replicas}"
            )
        text += (
            "sharing:\n"
            "  timeSlicing:\n"
            "    resources:\n"
            f"    - name: {resource}\n"
            f"      replicas: {time_slicing_replicas}\n"
        )
    path.write_text(text)
    return path


def environment(root: DriverRoot, state: Path, config: Path) -> dict[str, str]:
    """The plugin's environment over the simulated NVML in ``root`` serving ``state`` (the flags
    have these environment variables as their equivalents; the plugin's other defaults stand)."""
    return {
        **root.environment(state),  # LD_LIBRARY_PATH, GPUSHARE_NVML_STATE
        "DRIVER_ROOT_CTR_PATH": str(root.root),
        "CONFIG_FILE": str(config),
        "DEVICE_LIST_STRATEGY": "envvar",
        "DEVICE_ID_STRATEGY": "uuid",
        "FAIL_ON_INIT_ERROR": "true",
    }


def command(plugin: Path, socket_directory: Path | None = None) -> list[str]:
    """The plugin's command line. With ``socket_directory``, it runs in a private mount namespace
    (root only) where /var/lib/kubelet/device-plugins is that directory, so a test needs no
    kubelet and leaves the machine's directory alone; without, it serves the real one."""
    if socket_directory is None:
        return [str(plugin)]
    script = (
        "set -e; mount -t tmpfs gpushare-device-plugin /var/lib; "  # a private /var/lib, empty
        f'mkdir -p {KUBELET_DEVICE_PLUGINS}; mount --bind "$0" {KUBELET_DEVICE_PLUGINS}; exec "$1"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(socket_directory),
        str(plugin),
    ]


def start(
    plugin: Path, root: DriverRoot, state: Path, config: Path, log: Path, socket_directory: Path | None = None
) -> subprocess.Popen[bytes]:
    """The plugin running over the simulated NVML, its output in ``log``: registering with the
    kubelet in /var/lib/kubelet/device-plugins, or (``socket_directory``) in a directory of the
    caller's (:func:`command`). SIGTERM stops it; it removes its socket."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **environment(root, state, config)}
    with log.open("wb") as output:
        return subprocess.Popen(
            command(plugin, socket_directory), env=env, stdout=output, stderr=subprocess.STDOUT
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    binaries = build()
    print(binaries.plugin)
    print(binaries.kubelet_stub)
    return 0


if __name__ == "__main__":
    sys.exit(main())
