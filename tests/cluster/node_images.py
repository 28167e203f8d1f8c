"""The real node's local images, built here because no image registry is reachable: the pod
sandbox (pause) image and a test image with Debian's static busybox, each an OCI archive that
``ctr images import`` takes.

Each is made with umoci (an empty image, the files inserted as one layer, its entrypoint set) and
kept as ``build/cluster/images/<name>-<hash>.tar``, the hash over what goes into it (the sources,
the Debian package's version, the tools' versions), so a warm run does not rebuild it and an edit
does. Its reference is ``localhost/jupyter-gpushare/<name>:<hash>`` (:attr:`LocalImage.ref`):
``imagePullPolicy: IfNotPresent`` finds it in the node's containerd and never asks a registry.

* pause: ``pause/pause.c`` compiled statically with gcc (what Kubernetes' pause does: hold the
  pod's namespaces, reap zombies, exit on SIGTERM);
* busybox: ``/bin/busybox`` from Debian's ``busybox-static`` (``apt-get download``, no install)
  with a symlink per applet in ``/bin``: ``sh``, ``httpd``, ``wget``, ``dd``, ….
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .build import REPOSITORY

IMAGES = REPOSITORY / "build" / "cluster" / "images"
PAUSE_SOURCE = Path(__file__).resolve().parent / "pause" / "pause.c"
REPOSITORY_PREFIX = "localhost/jupyter-gpushare"
BUSYBOX_PACKAGE = "busybox-static"


@dataclass(frozen=True)
class LocalImage:
    """An OCI archive under build/ and the name it has once imported."""

    name: str
    tag: str
    archive: Path

    @property
    def base(self) -> str:
        return f"{REPOSITORY_PREFIX}/{self.name}"

    @property
    def ref(self) -> str:
        return f"{self.base}:{self.tag}"


def _run(command: list[str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise RuntimeError(
            f"{command[0]} is missing: the real node's images need Debian's umoci, gcc and apt "
            "(docs/development.md, The test cluster)"
        ) from error
    except subprocess.CalledProcessError as error:
        raise RuntimeError(
            f"{' '.join(command)} failed ({error.returncode}): {error.stderr.strip()}"
        ) from error
    return done.stdout


def _tool_versions() -> bytes:
    return _run(["umoci", "--version"]).encode()


def _package(directory: Path, files: dict[str, Path], entrypoint: list[str], archive: Path) -> None:
    """An OCI archive of one layer holding ``files`` (image path → local path) at ``archive``,
    tagged with the archive's tag (the file name's hash)."""
    tag = archive.stem.rsplit("-", 1)[1]
    layout = directory / "layout"
    image = f"{layout}:{tag}"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", image])
    root = directory / "rootfs"
    for target, source in files.items():
        destination = root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            destination.symlink_to(source.readlink())
        elif source.is_dir():
            destination.mkdir()
            destination.chmod(source.stat().st_mode & 0o7777)
        else:
            shutil.copy2(source, destination)
    _run(["umoci", "insert", "--image", image, str(root), "/"])
    config = ["umoci", "config", "--image", image, "--config.workingdir=/"]
    config += [f"--config.entrypoint={part}" for part in entrypoint]
    _run(config)
    partial = archive.with_name(archive.name + ".partial")
    # index.json, oci-layout and blobs/ at the archive's top: the layout ctr imports.
    _run(["tar", "-C", str(layout), "-cf", str(partial), "."])
    partial.rename(archive)
    for stale in archive.parent.glob(f"{archive.name.rsplit('-', 1)[0]}-*.tar"):
        if stale != archive:
            stale.unlink(missing_ok=True)


def pause_image() -> LocalImage:
    """The pod sandbox image, built first when missing (seconds)."""
    sha = hashlib.sha256(PAUSE_SOURCE.read_bytes() + _tool_versions() + _run(["gcc", "--version"]).encode())
    tag = sha.hexdigest()[:12]
    archive = IMAGES / f"pause-{tag}.tar"
    if not archive.exists():
        IMAGES.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="pause-", dir=IMAGES) as scratch:
            binary = Path(scratch) / "pause"
            _run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(PAUSE_SOURCE)])
            _package(Path(scratch), {"/pause": binary}, ["/pause"], archive)
    return LocalImage("pause", tag, archive)


def _busybox_deb() -> Path:
    """Debian's busybox-static package of the version apt knows, downloaded once into IMAGES."""
    version = _run(["apt-cache", "policy", BUSYBOX_PACKAGE])
    candidate = next(
        (line.split(":", 1)[1].strip() for line in version.splitlines() if "Candidate:" in line), ""
    )
    if not candidate or candidate == "(none)":
        raise RuntimeError(
            f"apt knows no {BUSYBOX_PACKAGE} package (run `apt-get update`): "
            "the real node's test image needs it"
        )
    cached = sorted(IMAGES.glob(f"{BUSYBOX_PACKAGE}_*.deb"))
    wanted = [path for path in cached if _run(["dpkg-deb", "-f", str(path), "Version"]).strip() == candidate]
    if wanted:
        return wanted[0]
    for stale in cached:
        stale.unlink()
    IMAGES.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", "download", f"{BUSYBOX_PACKAGE}={candidate}"], cwd=IMAGES)
    return next(IMAGES.glob(f"{BUSYBOX_PACKAGE}_*.deb"))


def busybox_image() -> LocalImage:
    """The test image (Debian's static busybox), built first when missing (seconds)."""
    deb = _busybox_deb()
    sha = hashlib.sha256(deb.name.encode() + _tool_versions())
    tag = sha.hexdigest()[:12]
    archive = IMAGES / f"busybox-{tag}.tar"
    if not archive.exists():
        with tempfile.TemporaryDirectory(prefix="busybox-", dir=IMAGES) as scratch:
            unpacked = Path(scratch) / "deb"
            _run(["dpkg-deb", "-x", str(deb), str(unpacked)])
            busybox = unpacked / "bin" / "busybox"
            files = {"/bin/busybox": busybox}
            links = Path(scratch) / "links"
            links.mkdir()
            for applet in _run([str(busybox), "--list"]).split():
                if applet != "busybox":
                    (links / applet).symlink_to("busybox")
                    files[f"/bin/{applet}"] = links / applet
            scratch_dir = Path(scratch) / "tmp"
            scratch_dir.mkdir(mode=0o1777)
            scratch_dir.chmod(0o1777)  # what the mode above loses to the umask
            files["/tmp"] = scratch_dir
            _package(Path(scratch), files, ["/bin/sh"], archive)
    return LocalImage("busybox", tag, archive)
