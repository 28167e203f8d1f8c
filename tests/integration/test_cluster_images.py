"""The test cluster's kernel image (tests/cluster/images.py): built from
examples/kubernetes/kernel-image/Dockerfile as its header tells users, on a Debian base made with
debootstrap, kept as an archive by a hash of what goes into it.

The archive is what the real node's containerd imports, so these tests hold the archive itself:
its configuration against the Dockerfile, a private containerd (its own root, state and socket in
the test's directory, no CRI) importing it into the ``k8s.io`` namespace and running the kernel
side in it as the image's user, and the cache answering a second call without a rebuild.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ..cluster import images
from ..support.polling import wait_until

# A cold build (debootstrap, then pip installing the kernel side from PyPI) takes minutes.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DOCKERFILE = images.KERNEL_CONTEXT / "Dockerfile"
# What the pod's command needs of the image: the package, ipykernel, and pyzmq with CurveZMQ.
CHECK = (
    "import json, os, sys, jupyter_gpushare, ipykernel, zmq; print(json.dumps({'uid': os.getuid(), "
    "'gid': os.getgid(), 'cwd': os.getcwd(), 'prefix': sys.prefix, 'curve': zmq.has('curve')}))"
)


@pytest.fixture(scope="module")
def kernel() -> images.Image:
    return images.kernel_image()


def archived_config(archive: Path) -> tuple[list[str], dict[str, Any]]:
    """The repository tags and the image configuration a docker-archive carries."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        [entry] = manifest
        return entry["RepoTags"], json.load(tar.extractfile(entry["Config"]))  # type: ignore[arg-type]


def dockerfile_instruction(keyword: str) -> str:
    """The argument of the Dockerfile's last ``keyword`` instruction (USER, WORKDIR)."""
    found = re.findall(rf"^{keyword}\s+(\S+)\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert found, f"the Dockerfile has no {keyword}"
    return str(found[-1])


def test_the_image_is_configured_as_the_dockerfile_says(kernel: images.Image) -> None:
    tags, config = archived_config(kernel.archive)
    assert tags == [kernel.reference]
    settings = config["config"]
    assert settings["User"] == dockerfile_instruction("USER") == "1000:100"
    assert settings["WorkingDir"] == dockerfile_instruction("WORKDIR") == "/home/jovyan"
    env = dict(item.split("=", 1) for item in settings["Env"])
    # The base's environment first on PATH: the `python` and `pip` the Dockerfile and pods run.
    assert env["PATH"].split(":")[0] == f"{images.BASE.venv}/bin"
    assert {"PIP_NO_CACHE_DIR": "1", "PYTHONUNBUFFERED": "1"}.items() <= env.items()
    assert config["os"] == "linux"


@contextmanager
def private_containerd(directory: Path) -> Iterator[list[str]]:
    """A containerd of the test's own (root, state, socket and opt under ``directory``; no CRI,
    so no CNI or kubelet paths), yielding the ``ctr`` command that talks to it."""
    socket = directory / "containerd.sock"
    config = directory / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{directory}/root"\nstate = "{directory}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{socket}"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{directory}/opt"\n'
    )
    ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io"]
    with (directory / "containerd.log").open("w") as log:
        process = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    try:
        wait_until(
            lambda: subprocess.run([*ctr, "version"], capture_output=True).returncode == 0,
            60,
            message="containerd answering on its socket",
        )
        yield ctr
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_containerd_imports_it_and_runs_the_kernel_side_as_its_user(
    kernel: images.Image, tmp_path: Path
) -> None:
    with private_containerd(tmp_path) as ctr:
        subprocess.run([*ctr, "images", "import", str(kernel.archive)], check=True, capture_output=True)
        listed = subprocess.run([*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True)
        assert kernel.reference in listed.stdout.split()
        # runc's state and the I/O fifos in the test's directory, and a cgroup of one level that
        # runc removes with the container (ctr's default, /k8s.io/<id>, leaves /k8s.io behind);
        # containerd 1.6's shims put their sockets in /run/containerd/s whatever its
        # configuration says, and remove them on exit.
        name = f"jupyter-gpushare-image-check-{tmp_path.name}"
        private = ["--runc-root", str(tmp_path / "runc"), "--fifo-dir", str(tmp_path / "fifo")]
        run = [*ctr, "run", "--rm", *private, "--cgroup", f"/{name}", kernel.reference, name]
        ran = subprocess.run([*run, "python", "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {
        "uid": 1000,
        "gid": 100,
        "cwd": "/home/jovyan",
        "prefix": images.BASE.venv,
        "curve": True,
    }


def test_a_second_call_is_answered_from_the_cache(kernel: images.Image) -> None:
    before = kernel.archive.stat()
    again = images.kernel_image()
    after = again.archive.stat()
    assert again == kernel
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )


def copy_inputs(root: Path) -> Path:
    """What the kernel image is built from, copied into ``root`` as a repository's layout."""
    context = root / images.KERNEL_CONTEXT.relative_to(images.REPOSITORY)
    shutil.copytree(images.KERNEL_CONTEXT, context, ignore=shutil.ignore_patterns("wheels"))
    for name in images.WHEEL_SOURCES:
        source = images.REPOSITORY / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "labextension"))
        else:
            shutil.copy2(source, root / name)
    return root


def test_the_tag_follows_what_goes_into_the_image(tmp_path: Path) -> None:
    base = images.base_image()
    root = copy_inputs(tmp_path)
    tag = images.kernel_image_for(base, root).digest
    assert tag == images.kernel_image_for(base, images.REPOSITORY).digest

    # Not inputs: a wheel a user left in wheels/, the built JupyterLab extension, bytecode.
    (root / "examples/kubernetes/kernel-image/wheels").mkdir()
    (root / "examples/kubernetes/kernel-image/wheels/old-0.0.1-py3-none-any.whl").write_bytes(b"x")
    (root / "jupyter_gpushare/labextension").mkdir()
    (root / "jupyter_gpushare/labextension/package.json").write_text("{}")
    (root / "jupyter_gpushare/__pycache__").mkdir(exist_ok=True)
    (root / "jupyter_gpushare/__pycache__/x.cpython-311.pyc").write_bytes(b"x")
    assert images.kernel_image_for(base, root).digest == tag

    tags = {tag}
    for edited in [
        "examples/kubernetes/kernel-image/Dockerfile",
        "jupyter_gpushare/__init__.py",
        "pyproject.toml",
    ]:
        with (root / edited).open("a") as file:
            file.write("\n# edited\n")
        tags.add(images.kernel_image_for(base, root).digest)
    other_base = images.base_image(images.BaseRecipe(packages=(*images.BASE.packages, "git")))
    assert other_base.digest != base.digest
    tags.add(images.kernel_image_for(other_base, root).digest)
    assert len(tags) == 5
