"""What the administrator of a team box sees, with real OS users (issue 37): the broker's log
names the user behind each request on its socket, a mistyped ``admin_users`` name is warned
of, the doctor tells a broker that is not running from one a user may not reach, and a user's
own kernelspecs leave the administrator's "Python 3 (GPU)" in force.

One broker (root's) and one user, ``gpu-ann-…``, serve the module; each test puts back what it
changed (a directory's mode, a group, the broker).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support.hermetic import isolated_from_the_machine
from ..support.hub import ADMIN_TOKEN, HUB_BASE, Hub, proxy_command
from ..support.polling import wait_until
from ..support.teambox import OSUser, TeamBox, environment_python, team_box

pytestmark = pytest.mark.integration

RUN = secrets.token_hex(3)
ANN = f"gpu-ann-{RUN}"
NOBODY = f"ada-{RUN}"  # an admin_users name no user of the machine has
GROUP = f"gpu-users-{RUN}"


@pytest.fixture(scope="module")
def box() -> Iterator[TeamBox]:
    with team_box((ANN,), {"sample_interval": 0.5}, broker={"admin_users": [NOBODY]}) as made:
        yield made


def as_user(
    box: TeamBox, user: OSUser, code: str, groups: list[int] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run as ``user`` with the supplementary ``groups`` (none by default: a
    session started before the user was added to any)."""
    arguments = {**user.popen_arguments(), "extra_groups": groups or []}
    return subprocess.run(
        [str(box.python), "-c", code],
        env={**box.env_for(user), **env},
        capture_output=True,
        text=True,
        timeout=300,
        **arguments,
    )


def doctor(box: TeamBox, user: OSUser, groups: list[int] | None = None) -> dict[str, dict[str, str]]:
    """``jupyter gpushare doctor --json`` as ``user``: its checks by name."""
    code = "import sys; from jupyter_gpushare.cli import main; sys.exit(main(['doctor', '--json']))"
    done = as_user(box, user, code, groups)
    assert done.stdout, done.stderr
    return {check["name"]: check for check in json.loads(done.stdout)["checks"]}


# ---- the broker's log ----------------------------------------------------------------------------


def test_an_admin_users_name_that_is_nobody_is_warned_of_at_start(box: TeamBox) -> None:
    """Failed before: not a word of it; its administrator would just not be an admin."""
    wait_until(lambda: "GPUShareBroker.admin_users" in box.broker_log(), timeout=60)
    [warning] = [line for line in box.broker_log().splitlines() if "GPUShareBroker.admin_users" in line]
    assert warning.startswith("[W ")
    assert warning.endswith(
        f"GPUShareBroker.admin_users names no user of this machine: {NOBODY} (on the Unix socket "
        "callers are this machine's users)"
    )


def test_the_log_names_the_user_behind_each_socket_request(box: TeamBox) -> None:
    """Failed before: ``404 GET /api/gpushare/broker/no-such-route (0.0.0.0)``."""
    ann = box.users[ANN]
    code = (
        "import os; from jupyter_gpushare.backends.broker_client.transport import BrokerClient\n"
        f"try:\n    BrokerClient({box.broker_url!r}).call('GET', 'no-such-route')\n"
        "except Exception:\n    print(os.getpid())\n"  # the broker's 404, as a domain error
    )
    done = as_user(box, ann, code)
    pid = done.stdout.strip()
    assert pid.isdigit(), done

    def logged() -> list[str]:
        return [line for line in box.broker_log().splitlines() if "/no-such-route" in line]

    # tornado's line of the refusal, and its access log's: both name the caller.
    lines = wait_until(lambda: len(logged()) >= 2 and logged(), timeout=30)
    for line in lines:
        assert f"404 GET /api/gpushare/broker/no-such-route (user {ANN}, uid {ann.uid}, pid {pid})" in line


# ---- the doctor ----------------------------------------------------------------------------------


@contextlib.contextmanager
def socket_directory_for(box: TeamBox, group: str) -> Iterator[int]:
    """The socket's directory open to ``group`` only (0750), as an administrator may set it."""
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    directory = box.socket.parent
    try:
        gid = grp.getgrnam(group).gr_gid
        os.chown(directory, 0, gid)
        directory.chmod(0o750)
        yield gid
    finally:
        directory.chmod(0o755)
        os.chown(directory, 0, 0)
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def test_the_doctor_tells_a_broker_you_may_not_reach_from_one_that_is_not_running(box: TeamBox) -> None:
    """Failed before: "start the broker" for a broker running behind a directory the user may
    not pass, and "fix the GPUs check first" where no GPUs check was printed."""
    ann = box.users[ANN]
    directory = box.socket.parent
    with socket_directory_for(box, GROUP) as gid:
        checks = doctor(box, ann)
        broker = checks["broker"]
        assert broker["status"] == "FAIL"
        assert broker["fix"] == (
            f"the broker may well be running, but you may not reach it: permission denied on "
            f"{directory} (mode 0750, owner root, group {GROUP}); ask the administrator to add "
            f"you to group {GROUP} (then log in again)"
        )
        assert "GPUs" not in checks
        assert checks["test kernel"]["fix"] == "fix the broker check first"

        # Added to the group, but this session began before: it needs a new login.
        subprocess.run(["gpasswd", "-a", ANN, GROUP], check=True, capture_output=True)
        stale = doctor(box, ann)["broker"]
        assert stale["fix"].endswith(
            f"you are in group {GROUP}, but this session started before you were: log out and in "
            f"again (or run newgrp {GROUP})"
        ), stale
        # A new login has the group: through.
        assert doctor(box, ann, groups=[gid])["broker"]["status"] == "OK"

    # A broker that was killed leaves its socket behind with nobody listening: not running.
    box.kill_broker()
    try:
        stopped = doctor(box, ann)["broker"]
        assert stopped["fix"].startswith(
            f"nothing listens on {box.socket}: the broker is not running; start the broker"
        ), stopped
    finally:
        box.start_broker()


# ---- a user's kernelspecs and the administrator's --------------------------------------------------


def cli_as(box: TeamBox, user: OSUser | None, python: Path, *arguments: str) -> str:
    """``jupyter gpushare …`` run by ``python`` as ``user`` (root: None), without the box's
    ``JUPYTER_PATH``: the kernelspecs are where an installation puts them."""
    code = f"import sys; from jupyter_gpushare.cli import main; sys.exit(main({list(arguments)!r}))"
    return python_as(box, user, python, code)


def kernelspecs_seen_by(box: TeamBox, user: OSUser, python: Path) -> dict[str, Any]:
    code = (
        "import json; from jupyter_client.kernelspec import KernelSpecManager; "
        "print(json.dumps(KernelSpecManager().find_kernel_specs()))"
    )
    return dict(json.loads(python_as(box, user, python, code)))


def python_as(box: TeamBox, user: OSUser | None, python: Path, code: str) -> str:
    """What ``python -c code`` printed, run as ``user`` (root: None) without the box's
    ``JUPYTER_PATH``."""
    if user is None:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(box.root / "root-home"), **isolated_from_the_machine()}
        run_as: dict[str, Any] = {}
    else:
        env = {key: value for key, value in box.env_for(user).items() if key != "JUPYTER_PATH"}
        run_as = user.popen_arguments()
    done = subprocess.run(
        [str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120, **run_as
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_users_sized_kernelspecs_leave_the_administrators_picker_in_force(box: TeamBox) -> None:
    """Failed before: ``kernelspec install --user --sizes 20G,whole`` also put a ``python3-gpu``
    in the user's directory, hiding the administrator's for good, and said nothing of it."""
    python = environment_python(box.root / "installation")  # the administrator's environment
    system = box.root / "installation" / "share" / "jupyter" / "kernels"
    said = cli_as(box, None, python, "kernelspec", "install", "--sys-prefix", "--sizes", "20G")
    assert f"Installed kernelspec python3-gpu in {system / 'python3-gpu'}\n" in said

    ann = box.users[ANN]
    mine = ann.home / "data" / "kernels"
    said = cli_as(box, ann, python, "kernelspec", "install", "--user", "--sizes", "20G,whole")
    assert said.splitlines() == [
        f"Installed kernelspec python3-gpu-20g in {mine / 'python3-gpu-20g'}, hiding the one in "
        f"{system / 'python3-gpu-20g'}",
        f"Installed kernelspec python3-gpu-whole in {mine / 'python3-gpu-whole'}",
        f"Not installed: python3-gpu: the one in {system / 'python3-gpu'} is in use (--picker "
        "installs one here, hiding it)",
    ]
    seen = kernelspecs_seen_by(box, ann, python)
    assert seen["python3-gpu"] == str(system / "python3-gpu")
    assert seen["python3-gpu-whole"] == str(mine / "python3-gpu-whole")

    # Asked for, it is installed, and the output says what it hides.
    said = cli_as(box, ann, python, "kernelspec", "install", "--user", "--sizes", "whole", "--picker")
    assert f"Installed kernelspec python3-gpu in {mine / 'python3-gpu'}, hiding the one in " in said
    assert kernelspecs_seen_by(box, ann, python)["python3-gpu"] == str(mine / "python3-gpu")
    # Sizes installed later leave it be, and say how to go back to the administrator's.
    said = cli_as(box, ann, python, "kernelspec", "install", "--user", "--sizes", "20G")
    assert said.splitlines()[-1] == (
        f"Not installed: python3-gpu: the one already in {mine / 'python3-gpu'} hides the one in "
        f"{system / 'python3-gpu'}; `jupyter kernelspec remove python3-gpu` removes it (--picker "
        "installs it anew)"
    )
    assert not re.search(r"Installed kernelspec python3-gpu in", said)


# ---- over HTTP, behind a real JupyterHub --------------------------------------------------------------

HUB_CONFIG = (
    HUB_BASE
    + """
c.JupyterHub.services = [
    {{"name": "tests", "api_token": {admin_token!r}}},
    {{"name": "gpushare-broker", "api_token": {broker_token!r}}},
]
c.JupyterHub.load_roles = [{{"name": "tests", "scopes": ["admin:users", "tokens"], "services": ["tests"]}}]
"""
)
BROKER_TOKEN = f"gpushare-broker-{RUN}"


def test_over_http_the_log_names_the_hub_user(tmp_path: Path) -> None:
    """A broker serving JupyterHub users (here the local backend's, on a simulated card) names
    the hub user behind a request, and an HTTP caller it could not identify by its address.
    Its admin_users are hub users' names, which only the hub knows: no warning."""
    from ..support.json_http import json_call
    from ..support.nodes import BIN
    from ..support.servers import free_port

    hub_port, port, broker_port = free_port(), free_port(), free_port()
    (tmp_path / "hub").mkdir()
    config = tmp_path / "hub" / "jupyterhub_config.py"
    config.write_text(
        HUB_CONFIG.format(
            port=port,
            hub_port=hub_port,
            proxy_api_port=free_port(),
            proxy=proxy_command(),
            root=tmp_path / "hub",
            admin_token=ADMIN_TOKEN,
            broker_token=BROKER_TOKEN,
        )
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("JUPYTER")}
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    log = tmp_path / "hub" / "hub.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(config)],
        cwd=tmp_path / "hub",
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    hub = Hub(f"http://127.0.0.1:{port}", process, log)
    broker: subprocess.Popen[bytes] | None = None
    try:

        def answers() -> bool:
            with contextlib.suppress(OSError):
                return hub.call("GET", "/hub/api/")[0] == 200
            assert process.poll() is None, log.read_text()[-4000:]
            return False

        wait_until(answers, timeout=120)
        user = f"hubuser-{RUN}"
        assert hub.call("POST", f"/hub/api/users/{user}")[0] == 201
        status, made = hub.call("POST", f"/hub/api/users/{user}/tokens", {"note": "test"})
        assert status == 201, made
        (tmp_path / "broker-config").mkdir()
        (tmp_path / "broker-config" / "jupyter_server_config.json").write_text(
            json.dumps({"GPUShareBroker": {"admin_users": [NOBODY]}})
        )
        broker_log = tmp_path / "broker.log"
        broker = subprocess.Popen(
            [str(BIN / "jupyter-gpushare"), "broker", "--ip", "127.0.0.1", "--port", str(broker_port)],
            env={
                "PATH": env["PATH"],
                "HOME": str(tmp_path),
                "JUPYTER_CONFIG_DIR": str(tmp_path / "broker-config"),
                "JUPYTER_RUNTIME_DIR": str(tmp_path / "broker-runtime"),
                **isolated_from_the_machine(),
                "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api",
                "JUPYTERHUB_API_TOKEN": BROKER_TOKEN,
                "JUPYTER_GPUSHARE_SIMULATE": "1xA100-80GB",
                "JUPYTER_GPUSHARE_LEDGER_PATH": str(tmp_path / "ledger" / "ledger.sqlite"),
            },
            stdout=broker_log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        route = f"http://127.0.0.1:{broker_port}/api/gpushare/broker/no-such-route"

        def refused() -> int | None:
            assert broker is not None and broker.poll() is None, broker_log.read_text()
            with contextlib.suppress(OSError):
                return json_call(route, timeout=10)[0]
            return None

        assert wait_until(refused, timeout=120) == 401  # no token: not identified
        status, _ = json_call(route, headers={"Authorization": f"token {made['token']}"}, timeout=60)
        assert status == 404

        def logged() -> list[str]:
            text = broker_log.read_text(errors="replace")
            return [
                line for line in text.splitlines() if "/no-such-route" in line and "tornado.access" in line
            ]

        lines = wait_until(lambda: len(logged()) >= 2 and logged(), timeout=30)
        assert "401 GET /api/gpushare/broker/no-such-route (127.0.0.1, not identified)" in lines[0]
        assert f"404 GET /api/gpushare/broker/no-such-route (hub user {user}, 127.0.0.1)" in lines[-1]
        # Its first lines are out (the warning would follow them), and say nothing of admin_users
        # beyond the limits line.
        wait_until(lambda: "GPU broker configuration:" in broker_log.read_text(), timeout=30)
        assert "GPUShareBroker.admin_users names" not in broker_log.read_text()
    finally:
        if broker is not None and broker.poll() is None:
            broker.terminate()
            broker.wait(timeout=30)
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
