"""The benchmarks cannot rot silently (issue 24).

``benchmarks/run_all.sh --quick`` runs in CI after the tests (``.ci/run``): a benchmark that
crashes fails the run, the ones after it still run, and a missed goal never fails it. The
runner is exercised here on a copy whose benchmarks are stand-ins (the real ones run in CI);
one of them crashes exactly as ``api_latency.py`` did when the ledger's private ``_record`` went
away. And the benchmarks reach the package through its public names only.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
RUNNER = BENCHMARKS / "run_all.sh"
CRASH = """
from jupyter_gpushare.backends.local import ledger
ledger._record({})  # what api_latency.py's attribution called until the ledger was refactored
"""


def stand_ins(tmp_path: Path, crashing: dict[str, str]) -> Path:
    """A checkout with the real runner and a stand-in for every benchmark script."""
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(RUNNER, tmp_path / "benchmarks" / "run_all.sh")
    for script in BENCHMARKS.glob("*.py"):
        body = crashing.get(
            script.name,
            f"""
            import sys
            print("{script.name} ran", *sys.argv[1:])
            print("VERDICT: a goal: MISSED")
            """,
        )
        (tmp_path / "benchmarks" / script.name).write_text(textwrap.dedent(body))
    return tmp_path / "benchmarks" / "run_all.sh"


def run(runner: Path, *arguments: str, limit: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHON=sys.executable)
    if limit is not None:
        env["LIMIT"] = limit
    return subprocess.run(
        ["bash", str(runner), *arguments], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_crash_fails_the_run_and_the_benchmarks_after_it_still_run(tmp_path: Path) -> None:
    done = run(stand_ins(tmp_path, {"api_latency.py": CRASH}), "--quick")
    assert done.returncode != 0
    assert (
        "AttributeError: module 'jupyter_gpushare.backends.local.ledger' has no attribute '_record'"
        in done.stderr
    )
    assert "FAILED: api_latency.py exited with status 1" in done.stdout
    for later in ("sampler.py", "broker_start.py", "broker_cluster.py"):
        assert f"{later} ran --quick" in done.stdout
    kept = (tmp_path / "benchmarks" / "results" / "latest.txt").read_text()
    assert "FAILED: api_latency.py" in kept.splitlines()[-1]


def test_a_missed_goal_never_fails_the_run(tmp_path: Path) -> None:
    done = run(stand_ins(tmp_path, {}), "--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("MISSED") == done.stdout.count("===== benchmarks/") >= 7
    assert "packing.py ran --quick --plot benchmarks/results/packing-quick.png" in done.stdout
    assert done.stdout.rstrip().endswith("all benchmarks ran")


def test_a_benchmark_that_never_ends_fails_the_run(tmp_path: Path) -> None:
    hang = "import time\nprint('sampler.py ran', flush=True)\ntime.sleep(600)\n"
    done = run(stand_ins(tmp_path, {"sampler.py": hang}), "--quick", limit="2")
    assert done.returncode != 0
    assert "FAILED: sampler.py did not end within 2 s" in done.stdout
    assert "broker_cluster.py ran --quick" in done.stdout


def test_the_runner_refuses_an_unknown_argument(tmp_path: Path) -> None:
    done = run(stand_ins(tmp_path, {}), "--quik")
    assert done.returncode == 2
    assert "usage: benchmarks/run_all.sh [--quick]" in done.stderr


def private_names(tree: ast.AST) -> list[str]:
    """``jupyter_gpushare`` names with a leading underscore that the module imports or reads
    from a module of the package it imported."""
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jupyter_gpushare"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jupyter_gpushare"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("script", sorted(path.name for path in BENCHMARKS.glob("*.py")))
def test_benchmarks_use_the_public_names_of_the_package(script: str) -> None:
    tree = ast.parse((BENCHMARKS / script).read_text())
    assert private_names(tree) == []


def test_the_check_finds_the_private_name_that_broke_api_latency() -> None:
    assert private_names(ast.parse(CRASH)) == ["ledger._record"]
