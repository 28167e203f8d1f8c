"""Builds the control plane (tests/cluster/controlplane/, a Go program) once per Kubernetes version
and source, and says where the binary is. The same binary is the real node's kubelet
(``kube-testcluster kubelet``) and kubectl: one build, sharing the compiled Kubernetes packages.

``python -m tests.cluster.build [--kubernetes oldest|newest]`` prints the binary's path,
building it first when it is missing (``make controlplane`` runs this). The binary is kept as
``build/cluster/bin/kube-testcluster-<version>-<hash>``: the version from the go.mod of that
version, the hash of the Go sources and module files, so an edit rebuilds and an unchanged tree
never does. Go's module and build caches stay where Go keeps them (``go env GOMODCACHE
GOCACHE``); a cold build downloads the modules and compiles Kubernetes (docs/development.md
says how long that takes).

Each Kubernetes version has its module file in controlplane/: ``go.mod`` pins the oldest we
support (what ``make test`` runs: 1.34, Go 1.24 or newer), ``go.newest.mod`` the newest served
(1.37, Go 1.26); the Go sources are the same. ``go`` runs with ``GOTOOLCHAIN=auto``: an installed
Go older than a module file asks for fetches that toolchain through the module proxy, once.
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

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "controlplane"
BINARIES = REPOSITORY / "build" / "cluster" / "bin"


@dataclass(frozen=True)
class Version:
    """One Kubernetes version the control plane is built against: its module file in SOURCE."""

    name: str  # oldest | newest
    modfile: str

    @property
    def kubernetes(self) -> str:
        """The k8s.io/kubernetes version the module file requires (``v1.34.4``)."""
        text = (SOURCE / self.modfile).read_text()
        found = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", text, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"{self.modfile} requires no k8s.io/kubernetes version")
        return found.group(1)

    @property
    def sumfile(self) -> str:
        return self.modfile.removesuffix(".mod") + ".sum"

    def digest(self) -> str:
        """A hash of what the binary is built from: the Go sources and this version's module files."""
        sha = hashlib.sha256()
        for path in [*sorted(SOURCE.glob("*.go")), SOURCE / self.modfile, SOURCE / self.sumfile]:
            sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return sha.hexdigest()[:12]

    def binary(self) -> Path:
        return BINARIES / f"kube-testcluster-{self.kubernetes}-{self.digest()}"


VERSIONS = {"oldest": Version("oldest", "go.mod"), "newest": Version("newest", "go.newest.mod")}


def go_environment() -> dict[str, str]:
    """The environment ``go`` runs in: the toolchain a module file needs (a newer one fetched
    when the installed Go is older; ``local``, some installations' default, would refuse)."""
    return {**os.environ, "GOTOOLCHAIN": "auto"}


def build(version: Version, log: object = sys.stderr) -> Path:
    """The binary for ``version``, built first when missing (minutes when Go's caches are cold)."""
    target = version.binary()
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "the test cluster is built with Go (1.24 or newer), which is not on PATH: install Go, "
            "then run `make controlplane`"
        )
    BINARIES.mkdir(parents=True, exist_ok=True)
    package = "k8s.io/component-base/version"
    major, minor = version.kubernetes.lstrip("v").split(".")[:2]
    # What the API server reports at /version, and the version its feature gates are for.
    ldflags = " ".join(
        [
            f"-X {package}.gitVersion={version.kubernetes}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            "-s -w",  # no symbol table or DWARF: a third smaller, and linking needs less memory
        ]
    )
    partial = target.with_name(target.name + ".partial")
    command = [go, "build", f"-modfile={version.modfile}", f"-ldflags={ldflags}"]
    command += ["-o", str(partial), "."]
    print(f"building the control plane for Kubernetes {version.kubernetes} (cold: minutes)…", file=log)
    started = time.monotonic()
    subprocess.run(command, cwd=SOURCE, env=go_environment(), check=True)
    partial.rename(target)
    for stale in BINARIES.glob(f"kube-testcluster-{version.kubernetes}-*"):
        if stale != target:
            stale.unlink(missing_ok=True)  # an older build of the same version
    print(f"built {target.name} in {time.monotonic() - started:.0f} s", file=log)
    return target


def find(version: str = "oldest") -> Path:
    """The binary for ``version`` (``oldest``, ``newest``, or ``$KUBE_TESTCLUSTER`` when set);
    fails with what to run when it has not been built."""
    if os.environ.get("KUBE_TESTCLUSTER"):
        return Path(os.environ["KUBE_TESTCLUSTER"])
    target = VERSIONS[version].binary()
    if not target.exists():
        make = "make controlplane" if version == "oldest" else "make controlplane-newest"
        raise FileNotFoundError(
            f"the test cluster's control plane for {version} Kubernetes is not built "
            f"({target.name} is missing under {BINARIES}): run `{make}` (a cold build takes minutes)"
        )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubernetes", choices=sorted(VERSIONS), default="oldest")
    args = parser.parse_args(argv)
    print(build(VERSIONS[args.kubernetes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
