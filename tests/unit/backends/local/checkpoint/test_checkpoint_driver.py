"""The checkpoint helper and the driver's edge where there is no NVIDIA driver (this machine):
every way in says what it needs instead of failing with a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jupyter_gpushare.backends.local.checkpoint import HelperRunner
from jupyter_gpushare.backends.local.checkpoint.driver import NotSupported, api_text, require, uuid_bytes
from tests.support.checkpoint_fake import FakeCheckpointDriver


def helper(*arguments: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpushare.backends.local.checkpoint", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_without_a_driver_the_helper_says_so_and_suspends_nothing() -> None:
    answer = helper("suspend", "--pid", str(os.getpid()))
    assert answer["ok"] is False and answer["unsupported"] is True
    assert "cannot be loaded" in str(answer["reason"]) or "no cuCheckpoint" in str(answer["reason"])
    result = HelperRunner().suspend(os.getpid(), 1000)
    assert not result.ok and result.unsupported and not HelperRunner().can_remap()


def test_a_bad_gpu_pair_is_refused_by_the_helper() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_gpushare.backends.local.checkpoint",
            "resume",
            "--pid",
            "1",
            "--pair",
            "no-equals",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "a GPU pair is OLD_UUID=NEW_UUID" in done.stderr


def test_a_helper_that_crashes_is_reported_not_raised(tmp_path) -> None:
    (tmp_path / "a-file").write_text("")
    runner = HelperRunner(simulated=str(tmp_path / "a-file" / "states"))  # it cannot keep its states
    result = runner.suspend(os.getpid(), 1000)
    assert not result.ok and "the checkpoint helper failed (exit 1): NotADirectoryError" in result.reason


def test_versions_and_uuids() -> None:
    assert api_text(12080) == "12.8" and api_text(13010) == "13.1"
    with pytest.raises(NotSupported, match=r"needs an NVIDIA driver with the CUDA 12\.8 driver API"):
        require(FakeCheckpointDriver(api=12040))
    with pytest.raises(NotSupported, match=r"onto another GPU needs .* CUDA 13\.1"):
        require(FakeCheckpointDriver(api=12080), remap=True)
    assert uuid_bytes("GPU-00112233-4455-6677-8899-aabbccddeeff") == bytes.fromhex(
        "00112233445566778899aabbccddeeff"
    )
    with pytest.raises(ValueError, match="not a GPU UUID"):
        uuid_bytes("GPU-0011")
