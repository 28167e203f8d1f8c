"""``--against REV``: the same measurement on an older commit of the package, in the same run.

A benchmark that compares our code with a baseline can also measure the code of another commit
beside ours, so that a regression (or a gain) is a ratio from one run on one machine under one
load, not two figures from two days. :func:`checkout` makes a git worktree of the commit under
``build/bench-against/`` (removed afterwards, whatever happens); the commit's package is then
imported from there, ahead of the installed one, in a child process:

* :func:`child_env` for a subprocess (a server, a broker, the benchmark script itself):
  ``PYTHONPATH`` starts with the worktree;
* :func:`import_package_from` at the top of a ``spawn``-ed worker, before it imports the package.

Everything else - the interpreter, the dependencies, the benchmark's own code - is this checkout's,
so only the package differs between the two sides. A commit whose package lacks what the
benchmark calls fails with the import or attribute error, named as the commit's.

:func:`alternate` serves the benchmarks whose whole run is one measurement (kernel starts, the
sampler): it runs the benchmark script itself alternately on this checkout and on the commit, each
run writing its headline figures to a JSON file (``--figures``), and prints each figure's median
per side and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
WORKTREES = REPOSITORY / "build" / "bench-against"


class RevisionError(RuntimeError):
    """The commit cannot be checked out or cannot run the measurement (one sentence)."""


@dataclass(frozen=True)
class Revision:
    """A commit checked out beside this one: ``label`` as asked, ``sha`` resolved."""

    label: str
    sha: str
    root: Path

    @property
    def short(self) -> str:
        return self.sha[:10]


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise RevisionError(f"git {' '.join(args)} failed: {detail[-1] if detail else done.returncode}")
    return done.stdout.strip()


def resolve(label: str) -> str:
    """The full sha of ``label`` (a commit, tag or branch), or a RevisionError saying why not."""
    if not label or label.startswith("-"):
        raise RevisionError(f"--against needs a git revision (a commit, tag or branch), not {label!r}")
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{label}^{{commit}}")
    except RevisionError:
        raise RevisionError(f"--against {label}: no such commit in {REPOSITORY}") from None


@contextlib.contextmanager
def checkout(label: str) -> Iterator[Revision]:
    """A worktree of ``label`` under ``build/bench-against/``, removed on the way out."""
    sha = resolve(label)
    WORKTREES.mkdir(parents=True, exist_ok=True)
    root = WORKTREES / f"{sha[:10]}-{os.getpid()}"
    _git("worktree", "add", "--detach", "--quiet", str(root), sha)
    try:
        if not (root / "jupyter_gpushare" / "__init__.py").is_file():
            raise RevisionError(f"--against {label}: commit {sha[:10]} has no jupyter_gpushare package")
        yield Revision(label, sha, root)
    finally:
        with contextlib.suppress(RevisionError):
            _git("worktree", "remove", "--force", str(root))
        with contextlib.suppress(RevisionError):
            _git("worktree", "prune")
        with contextlib.suppress(OSError):
            WORKTREES.rmdir()  # only when no other run's worktree is left in it


def child_env(revision: Revision | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python imports the package of ``revision`` (None: this checkout's)."""
    env = dict(os.environ if base is None else base)
    if revision is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(revision.root), env.get("PYTHONPATH")]))
    return env


def import_package_from(root: str | None) -> None:
    """In a fresh worker process: import ``jupyter_gpushare`` from ``root`` (None: as installed).

    Must run before anything imports the package; raises RevisionError when it was imported
    already or when it resolves elsewhere.
    """
    if root is None:
        return
    if "jupyter_gpushare" in sys.modules:
        raise RevisionError("jupyter_gpushare was imported before the worker chose its revision")
    sys.path.insert(0, root)
    import jupyter_gpushare

    where = Path(jupyter_gpushare.__file__ or "").resolve()
    if Path(root).resolve() not in where.parents:
        raise RevisionError(f"jupyter_gpushare resolved to {where}, not to the worktree {root}")


# ---- whole runs, alternately ----------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A headline figure a benchmark run reports, and which way is better."""

    name: str
    value: float
    higher_is_better: bool = False


def write_figures(path: str | None, figures: Sequence[Figure]) -> None:
    """What ``--figures PATH`` asks of a run: its headline figures as JSON."""
    if path is None:
        return
    Path(path).write_text(json.dumps([figure.__dict__ for figure in figures]))


def _run_once(script: Path, argv: Sequence[str], revision: Revision | None, log: Path) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="gpushare-against-") as directory:
        output = Path(directory) / "figures.json"
        with log.open("ab") as sink:
            done = subprocess.run(
                [sys.executable, str(script), *argv, "--figures", str(output)],
                env=child_env(revision),
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if done.returncode != 0 or not output.is_file():
            side = f"commit {revision.short} ({revision.label})" if revision else "this checkout"
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise RevisionError(
                f"{script.name} failed on {side} (exit status {done.returncode}):\n  " + "\n  ".join(tail)
            )
        return [Figure(**item) for item in json.loads(output.read_text())]


def add_options(parser: argparse.ArgumentParser, repeats: int = 3) -> None:
    """``--against REV`` and ``--repeat N`` for a benchmark that :func:`alternate` serves, and the
    ``--figures PATH`` its runs write their headline figures to."""
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run this benchmark on the package of git revision REV (a worktree under build/), "
        "alternating with this checkout, and print the ratios",
    )
    parser.add_argument(
        "--repeat", type=int, default=repeats, help=f"with --against: runs per side (default {repeats})"
    )
    parser.add_argument("--figures", metavar="PATH", help=argparse.SUPPRESS)


def forwarded(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--against`` and ``--repeat`` (and their values): what each run gets."""
    kept: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument in ("--against", "--repeat"):
            skip = True
        elif not argument.startswith(("--against=", "--repeat=")):
            kept.append(argument)
    return kept


def run_against(script: str, argv: Sequence[str] | None, label: str, repeats: int) -> int:
    """What ``main(argv)`` returns for ``--against`` (``argv`` None: the command line's): 0, or
    2 with the reason on stderr."""
    if argv is None:
        argv = sys.argv[1:]
    if repeats < 1:
        print(f"{Path(script).name}: --repeat must be at least 1", file=sys.stderr)
        return 2
    try:
        alternate(Path(script), forwarded(argv), label, repeats)
    except RevisionError as error:
        print(f"{Path(script).name}: {error}", file=sys.stderr)
        return 2
    return 0


def alternate(script: Path, argv: Sequence[str], label: str, repeats: int) -> None:
    """Run ``script argv`` ``repeats`` times on this checkout and on ``label``, alternating which
    side goes first, and print each headline figure's median per side and the ratio."""
    with checkout(label) as revision, tempfile.TemporaryDirectory(prefix="gpushare-against-") as tmp:
        log = Path(tmp) / "runs.log"
        ours: list[list[Figure]] = []
        theirs: list[list[Figure]] = []
        print(
            f"against {label} (commit {revision.short}): {repeats} runs of {script.name} "
            f"{' '.join(argv)} on each side, alternating, load average {load_average()}"
        )
        for index in range(repeats):
            sides: list[Revision | None] = [None, revision] if index % 2 == 0 else [revision, None]
            for side in sides:
                (ours if side is None else theirs).append(_run_once(script, argv, side, log))
        print(ratio_table(ours, theirs, revision))
        print(f"load average after: {load_average()}")


def ratio_table(ours: list[list[Figure]], theirs: list[list[Figure]], revision: Revision) -> str:
    names = [figure.name for figure in ours[0]]
    lines = [f"  {'figure':<44}{'this checkout':>15}{revision.short:>15}{'ratio':>8}  better"]
    for name in names:
        mine = [figure for run in ours for figure in run if figure.name == name]
        other = [figure for run in theirs for figure in run if figure.name == name]
        if not other:
            lines.append(f"  {name:<44}{statistics.median(f.value for f in mine):>15.4g}{'-':>15}")
            continue
        a = statistics.median(figure.value for figure in mine)
        b = statistics.median(figure.value for figure in other)
        ratio = a / b if b else float("inf")
        better = (ratio >= 1) == mine[0].higher_is_better if ratio != 1 else None
        verdict = "same" if better is None else ("this checkout" if better else revision.short)
        lines.append(f"  {name:<44}{a:>15.4g}{b:>15.4g}{ratio:>8.2f}  {verdict}")
    lines.append("  (medians over the runs; ratio = this checkout / the commit)")
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"
