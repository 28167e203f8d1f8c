"""jupyter_server's and jupyter_client's own kernel tests, with gpushare-provisioner as the
provisioner of the default kernelspec, ``python3`` (``make test`` runs this after our own tests).

The tests come from the sdists of the versions installed here: ``pip download`` fetches each into
build/conformance/ once per version, and it is unpacked beside it. Each suite runs in a pytest of
its own (both are packages named ``tests``), in its unpacked sdist with its own pytest
configuration, with our plugin (gpushare_conformance.py) loaded; the two run at once, as their
tests mostly wait on kernels and timers, and each one's output follows when it ends.

    .venv/bin/python tests/conformance/run.py [jupyter_server|jupyter_client] [-- PYTEST ARGS]

Arguments after ``--`` go to each pytest (``-x``, ``-k name``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

from jupyter_gpushare.config.kernelspecs import build_kernelspec

HERE = Path(__file__).resolve().parent
PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps")
CACHE = HERE.parent.parent / "build" / "conformance"
# The default kernelspec's slice, and the simulated pool the run's own ledger shares out.
SIZE = "4G"
MODE = "timeslice"
POOL = "1xA100-80GB"


@dataclass(frozen=True)
class Suite:
    """One upstream project's tests of the kernel lifecycle, as paths inside its sdist."""

    distribution: str
    paths: tuple[str, ...]


SUITES = (
    Suite("jupyter_server", ("tests/services/kernels", "tests/services/sessions")),
    Suite(
        "jupyter_client",
        ("tests/test_provisioning.py", "tests/test_kernelmanager.py", "tests/test_multikernelmanager.py"),
    ),
)


def unpacked(distribution: str, release: str) -> Path:
    """The unpacked sdist of ``distribution`` ``release``, fetched and unpacked at the first call."""
    target = CACHE / f"{distribution}-{release}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"{distribution}-{release}.tar.gz"
    if not archive.is_file():
        subprocess.run(
            [*PIP_DOWNLOAD, "--dest", str(CACHE), f"{distribution}=={release}"],
            check=True,
        )
    if not archive.is_file():
        raise SystemExit(f"pip download left no {archive.name} in {CACHE}")
    with tempfile.TemporaryDirectory(dir=CACHE) as staging, tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")
        (top,) = Path(staging).iterdir()  # an sdist holds one directory, <name>-<version>
        top.rename(target)  # whole or not at all: an interrupted unpack is not taken for one
    return target


def environment(home: Path) -> dict[str, str]:
    """This environment without the Jupyter and gpushare settings of whoever runs it, and ours
    in ``home``: the ``python3`` kernelspec first on ``$JUPYTER_PATH`` (ahead of the data
    directories their ``jp_environ`` fixture points at its own), and a ledger of the run's own
    on a simulated pool. The tests that do not ask for their fixtures' temporary Jupyter
    directories get ours, not the caller's."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("JUPYTER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    spec = home / "share" / "jupyter" / "kernels" / NATIVE_KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(build_kernelspec(SIZE, MODE), indent=2))
    env["JUPYTER_PATH"] = str(home / "share" / "jupyter")
    env["JUPYTER_GPUSHARE_SIMULATE"] = POOL
    env["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(home / "ledger.sqlite")
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[name] = str(home / name.lower())
    # Nor the machine's system-wide config (/etc/jupyter naming a broker, on a team box): with
    # platform directories jupyter_core's system config path is $XDG_CONFIG_DIRS/jupyter.
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["XDG_CONFIG_DIRS"] = str(home / "system-config")
    return env


@dataclass
class Run:
    """One suite's pytest, running in the background with its output in ``home``."""

    title: str
    process: subprocess.Popen[bytes]
    output: Path
    started: float

    def finish(self) -> int:
        status = self.process.wait()
        print(f"== {self.title}", flush=True)
        sys.stdout.buffer.write(self.output.read_bytes())
        print(f"== {self.title}: exit {status} after {time.monotonic() - self.started:.0f} s", flush=True)
        return status


def prepared(suite: Suite) -> tuple[str, Path]:
    """The installed release of the suite's project, and its unpacked sdist with the suite's paths."""
    release = version(suite.distribution)
    root = unpacked(suite.distribution, release)
    absent = [path for path in suite.paths if not (root / path).exists()]
    if absent:
        raise SystemExit(f"{suite.distribution} {release}'s sdist has no {', '.join(absent)}")
    return release, root


def start(suite: Suite, release: str, root: Path, home: Path, extra: list[str]) -> Run:
    home.mkdir()
    # Their own configuration (filterwarnings = error, timeouts, strict markers); no pytest-asyncio
    # (pytest-jupyter runs their coroutines), no cache written into the sdist.
    command = [sys.executable, "-m", "pytest", "-p", "gpushare_conformance"]
    command += ["-c", str(root / "pyproject.toml"), "--rootdir", str(root)]
    command += ["-p", "no:asyncio", "-p", "no:cacheprovider", "--color=no"]
    output = home / "pytest.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [*command, *extra, *suite.paths],
            cwd=root,
            env=environment(home),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    title = f"{suite.distribution} {release}: {' '.join(suite.paths)}"
    print(f"== {title}: started, {NATIVE_KERNEL_NAME} through gpushare-provisioner ({SIZE}, {MODE})")
    return Run(title, process, output, time.monotonic())


def main(argv: list[str]) -> int:
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    unknown = set(ours) - {suite.distribution for suite in SUITES}
    if unknown:
        raise SystemExit(f"usage: run.py [jupyter_server|jupyter_client] [-- PYTEST ARGS] (not {unknown})")
    chosen = [suite for suite in SUITES if not ours or suite.distribution in ours]
    sources = [(suite, *prepared(suite)) for suite in chosen]  # every download before any start
    with tempfile.TemporaryDirectory(prefix="gpushare-conformance-") as home:
        runs = [start(*source, Path(home) / source[0].distribution, extra) for source in sources]
        return max([run.finish() for run in runs])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
