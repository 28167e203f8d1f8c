"""Build the JupyterLab extension during ``pip install`` (hatch-jupyter-builder's build function).

``pyproject.toml`` names :func:`build` as the ``build-function`` of the ``jupyter-builder``
hook, so every wheel, sdist and editable install carries a prebuilt extension in
``jupyter_gpushare/labextension`` (shipped as ``share/jupyter/labextensions/jupyter-gpushare``)
and users never run a JupyterLab build.

The build is skipped when its inputs are unchanged: a hash of the sources (``src/``,
``style/``, ``package.json``, ``package-lock.json``, ``tsconfig.json``) is kept in
``labextension/.build-stamp`` next to them, and matched before anything runs. That makes a
repeated ``pip install -e .`` cost nothing, rebuilds after any edit (mtimes are not trusted:
git checkouts and sdists reset them), and lets an sdist that carries its build install
without Node.js. ``HATCH_JUPYTER_BUILDER_SKIP_NPM=1`` skips it altogether.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("jupyter_gpushare.build")

HERE = Path(__file__).resolve().parent
OUTPUT = HERE.parent / "jupyter_gpushare" / "labextension"
STAMP = HERE / ".build-stamp"
SOURCES = ("src", "style", "package.json", "package-lock.json", "tsconfig.json")
# Files the build must leave behind (the hook's ensured-targets check the same).
TARGETS = ("package.json", "static/style.js")


def source_hash() -> str:
    """A hash of every input of the build, by relative path and content."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = HERE / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if not file.exists():
                continue
            digest.update(file.relative_to(HERE).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def up_to_date() -> bool:
    """Whether the built extension exists and was built from the present sources."""
    if not all((OUTPUT / target).is_file() for target in TARGETS):
        return False
    return STAMP.is_file() and STAMP.read_text().strip() == source_hash()


def build(target_name: str, version: str, build_cmd: str = "build:prod", **_: object) -> None:
    """Install the npm dependencies if needed and build, unless the build is up to date."""
    if os.environ.get("HATCH_JUPYTER_BUILDER_SKIP_NPM") == "1":
        log.info("jupyter-gpushare: skipping the JupyterLab extension build as asked")
        return
    if not (HERE / "package.json").is_file():
        return  # an sdist without the extension's sources: its build is shipped as is
    if up_to_date():
        log.info("jupyter-gpushare: the JupyterLab extension is up to date")
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "building the JupyterLab extension needs Node.js 18+ with npm on PATH "
            "(or install from a wheel, which carries the built extension)"
        )
    lock = HERE / "package-lock.json"
    installed = HERE / "node_modules" / ".package-lock.json"
    if not installed.is_file() or (lock.is_file() and lock.stat().st_mtime > installed.stat().st_mtime):
        log.info("jupyter-gpushare: installing the extension's npm dependencies (about a minute)")
        subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=HERE, check=True)
    log.info("jupyter-gpushare: building the JupyterLab extension (npm run %s)", build_cmd)
    # The build script runs `jupyter-builder` (a build requirement): pip puts the build
    # environment's scripts on PATH; this interpreter's own scripts are the fallback.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), str(Path(sys.executable).parent)])
    subprocess.run([npm, "run", build_cmd], cwd=HERE, check=True, env=env)
    missing = [target for target in TARGETS if not (OUTPUT / target).is_file()]
    if missing:
        raise RuntimeError(f"the JupyterLab extension build did not produce {missing} in {OUTPUT}")
    STAMP.write_text(source_hash() + "\n")
