"""Builds the images the test cluster's real node runs, the way users build them, without a
registry, and keeps each as an archive containerd imports.

``python -m tests.cluster.images kernel`` prints the kernel image's archive, building it first
when it is missing (``make images`` runs this); ``--reference`` prints the name containerd knows
it by instead. From Python: :func:`kernel_image` (an :class:`Image`: ``.archive``, ``.reference``).

- **base**: Debian (``debootstrap --variant=minbase`` from Debian's mirror) with Python in a
  virtual environment at /opt/venv, first on ``PATH`` in the image's configuration. Debian's own
  Python refuses ``pip install`` into the system (PEP 668); the kernel image's Dockerfile runs
  ``pip install`` as root and the pod's command runs ``python``, both the environment's.
- **kernel**: examples/kubernetes/kernel-image/Dockerfile built as its header tells users (a wheel
  of this repository in ``wheels/`` beside the Dockerfile, then the build), with
  ``--build-arg BASE=`` the base, by buildah.

Each image is kept as ``build/images/<name>-<hash>.tar`` (a docker-archive, which ``ctr images
import`` takes), the hash over what goes into it: the base's suite, packages and recipe; the
kernel's base, build context (the Dockerfile) and the wheel's sources (the package, the kernels
and server configuration it carries, pyproject.toml). A present archive is the cache: buildah
does not run then. buildah's storage (overlay) is ``build/images/storage``.

What is not hashed: the versions Debian's mirror and PyPI serve on the day of a cold build (the
suite is pinned, the packages are not), as for any image built from a Dockerfile.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
IMAGES = REPOSITORY / "build" / "images"
STORAGE = IMAGES / "storage"
KERNEL_CONTEXT = REPOSITORY / "examples" / "kubernetes" / "kernel-image"
# What a wheel of the package is built from (pyproject.toml's wheel target, less the prebuilt
# JupyterLab extension, which a kernel never loads).
WHEEL_SOURCES = ("jupyter_gpushare", "kernels", "jupyter-config", "pyproject.toml")
WHEEL_SKIPPED = ("jupyter_gpushare/labextension",)
MIRROR = "http://deb.debian.org/debian"
# The CA bundle this machine trusts: mounted over the image's own for the build's RUN steps only,
# so pip reaches PyPI through a TLS-inspecting proxy the machine trusts (Debian's pip reads that
# file); nothing of it stays in the image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class BaseRecipe:
    """Everything the base image is made from; its ``repr`` is hashed into the image's tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    # python3-venv brings python3 and the pip wheel a new environment installs; Debian's pip
    # verifies TLS against ca-certificates' bundle.
    packages: tuple[str, ...] = ("python3-venv", "ca-certificates")
    venv: str = "/opt/venv"
    # What a container image needs none of: downloaded packages and indexes, documentation, the
    # build machine's device nodes, resolver and hostname (the runtime gives its own).
    removed: tuple[str, ...] = (
        "var/cache/apt/archives/*.deb",
        "var/lib/apt/lists/*",
        "usr/share/doc/*",
        "usr/share/man/*",
        "usr/share/info/*",
        "usr/share/locale/*",
        "var/log/*.log",
        "dev/*",
        "etc/resolv.conf",
        "etc/hostname",
    )
    env: tuple[tuple[str, str], ...] = field(
        default=(
            ("PATH", "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            ("VIRTUAL_ENV", "/opt/venv"),
            ("LANG", "C.UTF-8"),
        )
    )
    cmd: str = "python"


BASE = BaseRecipe()


@dataclass(frozen=True)
class Image:
    """One image: its name, and the hash of its inputs that tags it and names its archive."""

    name: str
    digest: str

    @property
    def reference(self) -> str:
        """The name buildah and containerd know the image by (``localhost/<name>:<hash>``)."""
        return f"localhost/{self.name}:{self.digest}"

    @property
    def archive(self) -> Path:
        return IMAGES / f"{self.name}-{self.digest}.tar"


def files_digest(root: Path, paths: list[Path]) -> str:
    """A hash of each file's path relative to ``root`` and its content."""
    sha = hashlib.sha256()
    for path in sorted(paths):
        sha.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def wheel_sources(root: Path = REPOSITORY) -> list[Path]:
    """The files a wheel of the package at ``root`` is built from (less the built extension)."""
    files: list[Path] = []
    for name in WHEEL_SOURCES:
        path = root / name
        candidates = path.rglob("*") if path.is_dir() else [path]
        for file in candidates:
            relative = file.relative_to(root).as_posix()
            if not file.is_file() or "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            if any(relative == skip or relative.startswith(skip + "/") for skip in WHEEL_SKIPPED):
                continue
            files.append(file)
    return files


def base_image(recipe: BaseRecipe = BASE) -> Image:
    return Image("jupyter-gpushare-base", hashlib.sha256(repr(recipe).encode()).hexdigest()[:12])


def kernel_image_for(base: Image, root: Path = REPOSITORY) -> Image:
    """The kernel image of the repository at ``root`` on ``base``: not built, only named."""
    context = root / KERNEL_CONTEXT.relative_to(REPOSITORY)
    dockerfile = [p for p in context.rglob("*") if p.is_file() and "wheels" not in p.parts]
    inputs = [base.reference, files_digest(root, dockerfile), files_digest(root, wheel_sources(root))]
    return Image("jupyter-gpushare-kernel", hashlib.sha256("\0".join(inputs).encode()).hexdigest()[:12])


def buildah(*args: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    """buildah on this repository's storage; RUN steps in a chroot (no user namespaces needed).
    Unchecked calls are probes or clean-ups whose failure is an answer: their errors are not shown."""
    command = ["buildah", "--root", str(STORAGE / "root"), "--runroot", str(STORAGE / "run")]
    command += ["--storage-driver", "overlay", *args]
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    output = subprocess.PIPE if capture else 2  # progress to stderr: stdout is the CLI's answer
    errors = None if check else subprocess.DEVNULL
    return subprocess.run(command, env=env, check=check, text=True, stdout=output, stderr=errors)


def require(*tools: str) -> None:
    if os.geteuid() != 0:
        raise RuntimeError(
            "building the test cluster's images needs root (debootstrap, buildah's chroot builds)"
        )
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(
            f"building the test cluster's images needs {', '.join(missing)} on PATH "
            f"(Debian: apt-get install {' '.join(missing)})"
        )


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One build at a time on this checkout (a test and ``make cluster`` may both ask)."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    with (IMAGES / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def in_storage(image: Image) -> bool:
    found = buildah("inspect", "--type", "image", image.reference, capture=True, check=False)
    return found.returncode == 0


def export(image: Image) -> None:
    """Write the image from buildah's storage to its archive, and drop older builds of its name."""
    partial = image.archive.with_name(image.archive.name + ".partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", image.reference, f"docker-archive:{partial}:{image.reference}")
    partial.rename(image.archive)
    for stale in IMAGES.glob(f"{image.name}-*.tar"):
        if stale != image.archive:
            stale.unlink()
    listed = buildah("images", "--format", "{{.Name}}:{{.Tag}}", capture=True).stdout.split()
    for reference in listed:
        if reference.startswith(f"localhost/{image.name}:") and reference != image.reference:
            buildah("rmi", reference, capture=True, check=False)


def build_base(image: Image, recipe: BaseRecipe = BASE) -> None:
    """debootstrap into a scratch container, make the environment, configure and commit."""
    require("buildah", "debootstrap")
    container = f"{image.name}-build"
    buildah("rm", container, capture=True, check=False)  # a build that was killed halfway
    buildah("from", "--quiet", "--name", container, "scratch", capture=True)
    try:
        root = Path(buildah("mount", container, capture=True).stdout.strip())
        packages = ",".join(recipe.packages)
        debootstrap = ["debootstrap", f"--variant={recipe.variant}", f"--include={packages}"]
        subprocess.run([*debootstrap, recipe.suite, str(root), MIRROR], check=True, stdout=subprocess.DEVNULL)
        buildah("run", container, "--", "python3", "-m", "venv", recipe.venv)
        for pattern in recipe.removed:
            for path in root.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        settings = [f"--env={name}={value}" for name, value in recipe.env]
        buildah("config", *settings, f"--cmd={recipe.cmd}", container)
        buildah("commit", "--quiet", container, image.reference, capture=True)
    finally:
        buildah("rm", container, capture=True, check=False)
    export(image)


def ensure_base(base: Image) -> None:
    """The base image in buildah's storage: loaded from its archive, or built."""
    if in_storage(base):
        if not base.archive.exists():
            export(base)
        return
    if base.archive.exists():
        buildah("pull", "--quiet", f"docker-archive:{base.archive}", capture=True)
        if in_storage(base):
            return
    build_base(base)


def build_kernel(image: Image, base: Image) -> None:
    """The Dockerfile's build context with a freshly built wheel in wheels/, then ``buildah bud``."""
    require("buildah")
    ensure_base(base)
    with tempfile.TemporaryDirectory(dir=IMAGES, prefix="context-") as directory:
        context = Path(directory) / "kernel-image"
        shutil.copytree(KERNEL_CONTEXT, context, ignore=shutil.ignore_patterns("wheels"))
        # The header's `pip wheel --no-deps -w examples/kubernetes/kernel-image/wheels .`; the
        # labextension build hook skips npm when the extension is built from the present sources.
        wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(context / "wheels")]
        subprocess.run([*wheel, str(REPOSITORY)], check=True, stdout=2)
        mounts = []
        if HOST_CA_BUNDLE.is_file():
            mounts = ["--volume", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
        bud = ["bud", "--pull=never", *mounts, "--build-arg", f"BASE={base.reference}"]
        buildah(*bud, "--tag", image.reference, str(context))
    export(image)


def built(image: Image, build: Callable[[], None]) -> Image:
    """``image``, built by ``build()`` unless its archive exists (checked again under the lock)."""
    if image.archive.exists():
        return image
    with locked():
        if not image.archive.exists():
            print(f"building {image.reference} (cold: minutes)…", file=sys.stderr)
            started = time.monotonic()
            build()
            print(f"built {image.archive.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return image


def base() -> Image:
    """The base image's archive, built when missing (about 2 minutes, mostly debootstrap)."""
    image = base_image()
    return built(image, lambda: build_base(image))


def kernel_image() -> Image:
    """The kernel image's archive, built when missing (and its base, when that is missing too)."""
    base_ = base()
    image = kernel_image_for(base_)
    return built(image, lambda: build_kernel(image, base_))


IMAGE_BUILDERS = {"base": base, "kernel": kernel_image}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", choices=sorted(IMAGE_BUILDERS))
    parser.add_argument("--reference", action="store_true", help="print the image's name instead")
    args = parser.parse_args(argv)
    image = IMAGE_BUILDERS[args.image]()
    print(image.reference if args.reference else image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
