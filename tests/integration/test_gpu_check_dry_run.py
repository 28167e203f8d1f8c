"""``benchmarks/gpu_check.py --dry-run``: the GPU check's held-memory and suspend/resume steps on
a simulated pool, so the script keeps working where no GPU is at hand. Its figures are not
measurements; this only shows every step still runs and reaches its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"


def test_the_gpu_checks_dry_run_passes_every_step(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("JUPYTER_GPUSHARE_")}
    env["OUT"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--sizes", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "held memory",
        "suspend/resume 1 GiB",
        "resume onto another card",
    ]
    assert all(line.endswith("PASS") for line in lines), lines
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] is True and report["memory"]["held"]["shrink_refused"] is True
