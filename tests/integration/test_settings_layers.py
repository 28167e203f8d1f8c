"""Settings on a shared box: a user's own Jupyter config changes their own settings, never the
administrator's (docs/admins/configuration.md, "Where the settings come from").

A real OS user runs the Jupyter applications that read ``~/.jupyter/jupyter_config.py`` and no
server config — ``jupyter run`` (jupyter_client's RunApp, as ``jupyter console`` and nbconvert do)
— with the box's broker named only in the administrator's file (the box's ``/etc/jupyter``), and
a file of their own that sets one harmless setting and tries to leave the broker and its limits.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support.nodes import Node
from ..support.servers import wait_ready
from ..support.teambox import OSUser, TeamBox, team_box

pytestmark = pytest.mark.integration

ALICE = f"gpu-set-{secrets.token_hex(3)}"
ADMIN_FILE = "jupyter_server_config.py"
USER_FILE = "jupyter_config.py"
# What the kernel reports: the settings its provisioner gave it, and whether the broker holds it.
PROBE = """
import json, os
from jupyter_gpushare.backends.broker_client.transport import BrokerClient
url = os.environ.get("JUPYTER_GPUSHARE_BROKER_URL", "")
held = url and [k["kernel_id"] for k in BrokerClient(url).call("GET", "kernels")]
print(json.dumps({
    "broker_url": url,
    "sample_interval": os.environ.get("JUPYTER_GPUSHARE_SAMPLE_INTERVAL"),
    "max_memory_per_kernel": os.environ.get("JUPYTER_GPUSHARE_MAX_MEMORY_PER_KERNEL"),
    "held_by_the_broker": bool(held) and os.environ["JUPYTER_GPUSHARE_KERNEL_ID"] in held,
}))
"""


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    with team_box((ALICE,), {"sample_interval": 0.5}) as made:
        # The administrator's file, as /etc/jupyter is on a real box: root's, read by everyone.
        made.system_config.mkdir(parents=True)
        (made.system_config / ADMIN_FILE).write_text(
            f"c.GPUShare.broker_url = {made.broker_url!r}\nc.GPUShare.max_memory_per_kernel = '8G'\n"
        )
        for directory in (made.system_config, made.system_config.parent, made.system_config.parents[1]):
            directory.chmod(0o755)
        yield made


def alice_env(box: TeamBox, alice: OSUser) -> dict[str, str]:
    """Alice's environment with no broker variable (only the administrator's file names it) and
    no sample interval (the environment would win over her file's)."""
    env = box.env_for(alice)
    del env["JUPYTER_GPUSHARE_BROKER_URL"], env["JUPYTER_GPUSHARE_SAMPLE_INTERVAL"]
    return env


def write_own_config(alice: OSUser, text: str) -> None:
    path = alice.home / "config" / USER_FILE
    path.write_text(textwrap.dedent(text))
    os.chown(path, alice.uid, alice.gid)


def run_as(box: TeamBox, alice: OSUser, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(box.python), *arguments],
        env=alice_env(box, alice),
        capture_output=True,
        text=True,
        timeout=180,
        **alice.popen_arguments(),
    )


def gpushare(box: TeamBox, alice: OSUser, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``jupyter gpushare ARGUMENTS`` as alice."""
    code = f"from jupyter_gpushare.cli import main; raise SystemExit(main({list(arguments)!r}))"
    return run_as(box, alice, "-c", code)


def jupyter_run(box: TeamBox, alice: OSUser) -> tuple[dict[str, Any], str]:
    probe = alice.home / "probe.py"
    probe.write_text(PROBE)
    os.chown(probe, alice.uid, alice.gid)
    done = run_as(box, alice, "-m", "jupyter_client.runapp", "--kernel=python3-gpu-4g", str(probe))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the kernel printed nothing:\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[-1]), done.stderr


def on_the_broker_with_her_interval(box: TeamBox) -> dict[str, Any]:
    """What the probe reports of a kernel on the box's broker, within its limits, at alice's own
    sample interval."""
    return {
        "broker_url": box.broker_url,
        "sample_interval": "2.0",
        "max_memory_per_kernel": "8G",
        "held_by_the_broker": True,
    }


def test_one_line_of_a_users_own_config_changes_that_setting_only(box: TeamBox) -> None:
    alice = box.users[ALICE]
    write_own_config(alice, "c.GPUShare.sample_interval = 2\n")
    seen, _ = jupyter_run(box, alice)
    assert seen == on_the_broker_with_her_interval(box)


def test_a_users_own_config_cannot_leave_the_broker_or_its_limits_and_is_told_so(box: TeamBox) -> None:
    alice = box.users[ALICE]
    own = alice.home / "config" / USER_FILE
    admins = box.system_config / ADMIN_FILE
    write_own_config(
        alice,
        """
        c.GPUShare.sample_interval = 2
        c.GPUShare.broker_url = ""
        c.GPUShare.max_memory_per_kernel = "80G"
        """,
    )
    seen, stderr = jupyter_run(box, alice)
    assert seen == on_the_broker_with_her_interval(box)
    for trait, value, kept in (("broker_url", "", box.broker_url), ("max_memory_per_kernel", "80G", "8G")):
        sentence = (
            f"GPUShare.{trait} = {value!r} in {own} is ignored: the administrator sets it to "
            f"{kept!r} in {admins}, which a user's settings cannot override"
        )
        assert stderr.count(sentence) == 1, stderr

    # The command line tells it too, and the doctor shows where each setting came from.
    status = gpushare(box, alice, "status")
    assert status.returncode == 0, status.stderr
    assert "jupyter gpushare: warning: GPUShare.broker_url = '' in" in status.stderr
    doctor = gpushare(box, alice, "doctor", "--no-kernel", "--json")
    settings = next(check for check in json.loads(doctor.stdout)["checks"] if check["name"] == "settings")
    assert settings["status"] == "WARN"
    assert f"GPUShare.max_memory_per_kernel = '80G' in {own} is ignored" in settings["detail"]

    # A server says at start which files it read and where each setting came from.
    server = box.server(alice, "settings", JUPYTER_GPUSHARE_BROKER_URL="")
    wait_ready(server)
    log = server.log_path.read_text()
    assert f"settings: config files: {admins} (administrator), {own}" in log, log
    assert f"broker_url, max_memory_per_kernel from {admins}" in log, log
    assert f"GPUShare.broker_url = '' in {own} is ignored" in log


def test_a_process_told_to_leave_a_broker_its_config_names_starts_no_kernel(
    node: Node, tmp_path: Path
) -> None:
    """A file on the config path names the broker (here root's own, so no administrator's lock
    holds it) and the environment empties it: `jupyter run` refuses in one sentence instead of
    placing its kernel on a private ledger beside the broker's."""
    config = Path(node.env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.py"
    config.write_text("c.GPUShare.broker_url = 'unix:/run/jupyter-gpushare/broker.sock'\n")
    script = tmp_path / "hello.py"
    script.write_text("print('started')\n")
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_client.runapp", "--kernel=python3-gpu-4g", str(script)],
        env={**node.env, "JUPYTER_GPUSHARE_BROKER_URL": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode != 0 and "started" not in done.stdout
    assert (
        f"GPUShare.broker_url = 'unix:/run/jupyter-gpushare/broker.sock' in {config} names the GPU "
        "broker, but $JUPYTER_GPUSHARE_BROKER_URL sets it to ''"
    ) in done.stderr, done.stderr
    assert not Path(node.env["JUPYTER_GPUSHARE_LEDGER_PATH"]).exists()  # nothing was placed
