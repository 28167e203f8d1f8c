"""The host-wide state a real node changes, recorded before it starts and put back after it stops.

The kubelet, containerd and the CNI bridge plugin change the machine, not only their own
directories: sysctls (the kubelet's kernel tunables, the bridge plugin's ``ip_forward``),
fixed paths (``/var/lib/kubelet``, ``/var/log/containers``, ``/var/lib/cni``, ``/run/netns``,
``/run/containerd``), network interfaces (the bridge, a veth per pod), mounts (each pod's
network namespace, volumes and root filesystem), cgroups (``kubepods`` in every hierarchy) and
iptables rules. :class:`HostState` is one snapshot of all of it; :func:`restore` puts back what
a later snapshot shows changed (kills what still runs in the node's cgroups, unmounts, removes
what was created, resets sysctls); :meth:`HostState.differences` says what still differs, in
words, for the teardown's own check and for the tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSCTLS = (
    # The kubelet's kernel tunables (protectKernelDefaults: false lets it set them).
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    # The bridge plugin's (isGateway): the host routes between the bridge and its other links.
    "net.ipv4.ip_forward",
)
# Fixed paths of the kubelet, containerd's CRI plugin and CNI that no setting moves.
PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/netns",
    "/run/containerd",
    "/run/jupyter-gpushare-real-node",  # the node's containerd's sockets (a socket's path is short)
)
CGROUPS = Path("/sys/fs/cgroup")
CGROUP_NAME = "kubepods"  # the kubelet's root for pods (cgroupsPerQOS), in every v1 hierarchy or v2's
IPTABLES_TABLES = ("filter", "nat", "mangle")
# A fixed path every containerd on the machine uses (its shims' sockets, /run/containerd/s),
# not only the node's: while another containerd runs, it is that one's too, and stays.
SHARED = {"/run/containerd": b"containerd"}  # its processes' names begin so (the shims' too)


def alive(process: Path) -> bool:
    """Whether the process of ``/proc/PID`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return process.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _in_use(path: str) -> bool:
    """Whether a process of the programs sharing ``path`` runs (the node's own have stopped)."""
    program = SHARED.get(path)
    if program is None:
        return False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_bytes().startswith(program) and alive(entry):
                    return True
    return False


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


@dataclass(frozen=True)
class Footprint:
    """Where a real node's changes can be told from the rest of a shared machine's (other test
    runs mount, make interfaces and add rules too): mounts under these directories, interfaces
    of these names (and veths on the node's bridge), iptables rules naming one of the markers."""

    directories: tuple[str, ...]
    links: tuple[str, ...]
    markers: tuple[str, ...]

    def mounted_here(self, point: str) -> bool:
        return any(point == top or point.startswith(top.rstrip("/") + "/") for top in self.directories)


def _mounts(footprint: Footprint) -> tuple[str, ...]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if footprint.mounted_here(point):
            points.append(point)
    return tuple(points)


def _links(footprint: Footprint) -> frozenset[str]:
    """The footprint's interfaces that exist, and every interface on one of them (the bridge's veths)."""
    found = set()
    for link in os.listdir("/sys/class/net"):
        master = Path("/sys/class/net", link, "master")
        if link in footprint.links or (master.exists() and master.resolve().name in footprint.links):
            found.add(link)
    return frozenset(found)


def _cgroups() -> frozenset[str]:
    if not CGROUPS.is_dir():
        return frozenset()
    candidates = [CGROUPS / CGROUP_NAME, *CGROUPS.glob(f"*/{CGROUP_NAME}")]  # v2, v1
    return frozenset(str(path) for path in candidates if path.is_dir())


def _iptables(footprint: Footprint) -> dict[str, tuple[str, ...]]:
    """Each table's chains and rules naming a marker, as iptables-save prints them, counters
    left out."""
    rules = {}
    for table in IPTABLES_TABLES:
        done = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True, check=False)
        lines = [
            line.split(" [", 1)[0] if line.startswith(":") else line
            for line in done.stdout.splitlines()
            if any(marker in line for marker in footprint.markers)
        ]
        rules[table] = tuple(lines)
    return rules


@dataclass(frozen=True)
class HostState:
    """What the real node may change on the machine, at one moment."""

    sysctls: dict[str, str]
    paths: frozenset[str]
    links: frozenset[str]
    mounts: tuple[str, ...]
    cgroups: frozenset[str]
    iptables: dict[str, tuple[str, ...]]
    shared: frozenset[str] = frozenset()  # SHARED paths another program uses now: not the node's to undo

    @classmethod
    def now(cls, footprint: Footprint) -> HostState:
        sysctls = {}
        for name in SYSCTLS:
            with contextlib.suppress(OSError):
                sysctls[name] = _sysctl_path(name).read_text().strip()
        return cls(
            sysctls=sysctls,
            paths=frozenset(path for path in PATHS if os.path.lexists(path)),
            shared=frozenset(path for path in SHARED if _in_use(path)),
            links=_links(footprint),
            mounts=_mounts(footprint),
            cgroups=_cgroups(),
            iptables=_iptables(footprint),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "sysctls": self.sysctls,
            "paths": sorted(self.paths),
            "links": sorted(self.links),
            "mounts": list(self.mounts),
            "cgroups": sorted(self.cgroups),
            "iptables": {table: list(rules) for table, rules in self.iptables.items()},
            "shared": sorted(self.shared),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostState:
        return cls(
            sysctls=dict(data["sysctls"]),
            paths=frozenset(data["paths"]),
            links=frozenset(data["links"]),
            mounts=tuple(data["mounts"]),
            cgroups=frozenset(data["cgroups"]),
            iptables={table: tuple(rules) for table, rules in data["iptables"].items()},
            shared=frozenset(data.get("shared", ())),
        )

    def changes(self, later: HostState) -> list[str]:
        """What ``later`` has that this snapshot had not (a sysctl's other value, a path, an
        interface, a mount, a cgroup, a rule), one sentence each: what a restore undoes."""
        found = []
        for name, value in self.sysctls.items():
            if later.sysctls.get(name) != value:
                found.append(f"sysctl {name} is {later.sysctls.get(name)}, was {value}")
        found += [f"{path} was created" for path in sorted(later.paths - self.paths - later.shared)]
        found += [f"network interface {link} was created" for link in sorted(later.links - self.links)]
        found += [f"{point} is mounted" for point in sorted(set(later.mounts) - set(self.mounts))]
        found += [f"cgroup {cgroup} was created" for cgroup in sorted(later.cgroups - self.cgroups)]
        for table, rules in later.iptables.items():
            added = set(rules) - set(self.iptables.get(table, ()))
            found += [f"iptables -t {table}: {rule} was added" for rule in sorted(added)]
        return found

    def differences(self, later: HostState) -> list[str]:
        """:meth:`changes`, and what this snapshot had that ``later`` has no more."""
        found = self.changes(later)
        found += [f"{path} was removed" for path in sorted(self.paths - later.paths)]
        for table, rules in self.iptables.items():
            gone = set(rules) - set(later.iptables.get(table, ()))
            found += [f"iptables -t {table}: {rule} was removed" for rule in sorted(gone)]
        return found


def _kill_cgroup_tree(root: Path) -> None:
    """SIGKILL every process in the cgroups under ``root`` (containers a crashed run left)."""
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_cgroup_tree(root: Path, deadline: float) -> None:
    """rmdir the cgroups under ``root``, deepest first, once their processes are gone."""
    while True:
        try:
            for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                directory.rmdir()
            root.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            _kill_cgroup_tree(root)
            time.sleep(0.2)


def restore(before: HostState, footprint: Footprint, timeout: float = 60.0) -> list[str]:
    """Undo what changed since ``before`` and return what is still changed (empty: all of it;
    what went meanwhile, a path or a rule, is no change to undo).

    iptables rules are not touched here: only their owner knows which are its own; the
    differences say what is left."""
    deadline = time.monotonic() + timeout
    now = HostState.now(footprint)
    for cgroup in sorted(now.cgroups - before.cgroups):
        _kill_cgroup_tree(Path(cgroup))
    # Mounts, newest first: a pod's volumes before the directories they are in.
    for point in reversed([point for point in now.mounts if point not in set(before.mounts)]):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    for link in sorted(now.links - before.links):
        subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
    for cgroup in sorted(now.cgroups - before.cgroups):
        with contextlib.suppress(OSError):
            _remove_cgroup_tree(Path(cgroup), deadline)
    for path in sorted(now.paths - before.paths - now.shared):
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)
    for name, value in before.sysctls.items():
        if now.sysctls.get(name) != value:
            with contextlib.suppress(OSError):
                _sysctl_path(name).write_text(value)
    return before.changes(HostState.now(footprint))
