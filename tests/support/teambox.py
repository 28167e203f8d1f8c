"""A team box for tests: real OS users, one GPU broker held by root, each user's servers as them.

The tests run as root (as CI does) and create the users they need with ``useradd`` (removed
again afterwards). Every user process — a jupyter server, a script — runs with that user's uid,
gid and no supplementary groups, in directories of that user's own, so what a user can reach is
exactly what the OS lets them reach. The broker runs as root with its ledger in a directory only
root can enter.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
from jupyter_gpushare.config.kernelspecs import install_kernelspecs

from .servers import JupyterServer, free_port

BIN = Path(sys.executable).parent
SIMULATE = "1xA100-80GB"
LEAN_SERVER = {"jupyterlab": False, "jupyter_lsp": False, "notebook_shim": False, "notebook": False}


def reachable_by_everyone(path: Path) -> bool:
    """Whether any user can run ``path``: every directory on the way lets others through."""
    resolved = path.resolve()
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in resolved.parents) and bool(
        os.stat(resolved).st_mode & stat.S_IXOTH
    )


def user_python(root: Path) -> Path:
    """A Python that the test users can run, with this environment's packages.

    This environment's own interpreter, where every user can reach it; else (pyenv under
    /root, as in CI's image) a virtual environment made from the system's Python of the same
    version that loads this environment's site-packages (.pth files and all).
    """
    own = Path(sys.executable)
    if reachable_by_everyone(own):
        return own
    return environment_python(root / "python")


def environment_python(directory: Path) -> Path:
    """A virtual environment of its own at ``directory``, made from the system's Python of this
    version, that loads this environment's site-packages (.pth files and all): every user can
    run it, and its ``sys.prefix`` (``--sys-prefix``) is the test's own."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next(
        (Path(d) / version for d in ("/usr/bin", "/usr/local/bin") if (Path(d) / version).exists()), None
    )
    if system is None or not reachable_by_everyone(system):
        pytest.fail(
            f"the team-box tests run processes as other users, who cannot run {sys.executable}; "
            f"install {version} system-wide (apt-get install {version})",
            pytrace=False,
        )
    subprocess.run(
        [str(system), "-m", "venv", "--without-pip", str(directory)], check=True, capture_output=True
    )
    [site_packages] = (directory / "lib").glob("python*/site-packages")
    [ours] = (Path(sys.prefix) / "lib").glob("python*/site-packages")
    (site_packages / "gpushare-tests.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    return directory / "bin" / "python"


@dataclass(frozen=True)
class OSUser:
    name: str
    uid: int
    gid: int
    home: Path

    def popen_arguments(self) -> dict[str, Any]:
        """What makes a child process this user's: uid, gid, and none of root's groups."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "cwd": self.home}


def create_user(name: str, base: Path) -> OSUser:
    if os.geteuid() != 0:
        pytest.fail("the team-box tests create OS users and need root (CI runs as root)", pytrace=False)
    with contextlib.suppress(KeyError):
        pwd.getpwnam(name)
        subprocess.run(["userdel", name], check=False, capture_output=True)
    home = base / name
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", "--user-group", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    user = OSUser(name, entry.pw_uid, entry.pw_gid, home)
    for directory in (home, home / "runtime", home / "config", home / "data", home / "ipython"):
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chown(directory, user.uid, user.gid)
    # Servers load only what the tests use (JupyterLab's extensions cost seconds per start).
    (home / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": LEAN_SERVER}})
    )
    return user


def remove_user(user: OSUser) -> None:
    # Every process of this user is one the test started (the user was made for it): by pid.
    for process in psutil.process_iter(["uids"]):
        if process.info["uids"] and process.info["uids"].real == user.uid:
            with contextlib.suppress(psutil.Error):
                process.kill()
    subprocess.run(["userdel", user.name], check=False, capture_output=True)


@dataclass
class TeamBox:
    """The box: its broker (root's), its users, their servers."""

    root: Path
    socket: Path
    ledger: Path
    broker_env: dict[str, str]
    python: Path  # what the users run
    users: dict[str, OSUser] = field(default_factory=dict)
    broker: subprocess.Popen[bytes] | None = None
    servers: list[JupyterServer] = field(default_factory=list)
    nofile: tuple[int, int] | None = None  # the broker's open files limit (soft, hard), if set

    @property
    def broker_url(self) -> str:
        return f"unix:{self.socket}"

    @property
    def system_config(self) -> Path:
        """The box's system-wide Jupyter config directory (what /etc/jupyter is on a real box),
        root's, read by every process of the box."""
        return self.root / "etc" / "xdg" / "jupyter"

    # ---- the broker ------------------------------------------------------------------------------

    def start_broker(self) -> None:
        log = (self.root / "broker" / "broker.log").open("ab")
        self.broker = subprocess.Popen(
            [str(BIN / "jupyter-gpushare"), "broker", "--socket", str(self.socket)],
            env=self.broker_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=None if self.nofile is None else self._limit_open_files,
        )
        deadline = time.monotonic() + 30
        client = BrokerClient(self.broker_url)
        while True:  # a killed broker leaves its socket file behind: wait for an answer
            if self.broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start:\n{self.broker_log()}")
            try:
                client.call("GET", "info")
                return
            except UnreachableError:
                time.sleep(0.05)

    def _limit_open_files(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def kill_broker(self) -> None:
        """kill -9: no cleanup, as a crash."""
        assert self.broker is not None
        self.broker.send_signal(signal.SIGKILL)
        self.broker.wait()

    def stop_broker(self) -> None:
        if self.broker is not None and self.broker.poll() is None:
            self.broker.terminate()
            try:
                self.broker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.broker.kill()
                self.broker.wait()

    def broker_log(self) -> str:
        return (self.root / "broker" / "broker.log").read_text(errors="replace")

    # ---- users -----------------------------------------------------------------------------------

    def env_for(self, user: OSUser, **extra: str) -> dict[str, str]:
        return {
            "HOME": str(user.home),
            "USER": user.name,
            "LOGNAME": user.name,
            "PATH": f"{self.python.parent}{os.pathsep}/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "JUPYTER_CONFIG_DIR": str(user.home / "config"),
            "JUPYTER_DATA_DIR": str(user.home / "data"),
            "JUPYTER_RUNTIME_DIR": str(user.home / "runtime"),
            "IPYTHONDIR": str(user.home / "ipython"),
            "JUPYTER_PATH": str(self.root / "prefix" / "share" / "jupyter"),
            # What this environment enables (the gpushare server extension), whatever Python runs.
            "JUPYTER_CONFIG_PATH": str(Path(sys.prefix) / "etc" / "jupyter"),
            "JUPYTER_PLATFORM_DIRS": "1",
            # The box's system-wide config directory (its /etc/jupyter): empty unless a test
            # writes an administrator's file there; never the machine's.
            "XDG_CONFIG_DIRS": str(self.system_config.parent),
            "JUPYTER_GPUSHARE_BROKER_URL": self.broker_url,
            "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
            "JUPYTER_GPUSHARE_QUEUE_POLL_INTERVAL": "0.1",
            **extra,
        }

    def run_as(self, user: OSUser, code: str, timeout: float = 120, **env: str) -> Any:
        """Run Python ``code`` as ``user``; what it printed last, as JSON."""
        done = subprocess.run(
            [str(self.python), "-c", textwrap.dedent(code)],
            env=self.env_for(user, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
            **user.popen_arguments(),
        )
        assert done.returncode == 0, f"as {user.name}:\n{done.stdout}\n{done.stderr}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    def server(self, user: OSUser, name: str, **env: str) -> JupyterServer:
        """A jupyter server of ``user``'s, using the broker."""
        port = free_port()
        token = f"token-{user.name}-{name}"
        root_dir = user.home / f"{name}-root"
        root_dir.mkdir(exist_ok=True)
        os.chown(root_dir, user.uid, user.gid)
        log_path = self.root / "logs" / f"{user.name}-{name}.log"
        process = subprocess.Popen(
            [
                str(self.python),
                "-m",
                "jupyter_server",
                f"--ServerApp.port={port}",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                "--ServerApp.open_browser=False",
                f"--ServerApp.root_dir={root_dir}",
            ],
            env=self.env_for(user, **env),
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
            **user.popen_arguments(),
        )
        server = JupyterServer(process, f"http://127.0.0.1:{port}", token, log_path)
        self.servers.append(server)
        return server


@contextlib.contextmanager
def team_box(
    users: tuple[str, ...],
    gpushare: dict[str, Any],
    broker: dict[str, Any] | None = None,
    nofile: tuple[int, int] | None = None,
) -> Iterator[TeamBox]:
    """A box with ``users`` and a broker configured with ``gpushare`` (c.GPUShare traits) and
    ``broker`` (c.GPUShareBroker traits), its open files limited to ``nofile`` if given."""
    root = Path(tempfile.mkdtemp(prefix="gpushare-teambox-"))
    root.chmod(0o755)
    broker_dir = root / "broker"
    broker_dir.mkdir(mode=0o700)
    (root / "logs").mkdir()
    install_kernelspecs(["4G", "6G", "12G"], prefix=str(root / "prefix"))
    (broker_dir / "config").mkdir()
    (broker_dir / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"GPUShare": gpushare, "GPUShareBroker": broker or {}})
    )
    run_dir = root / "run"
    run_dir.mkdir(mode=0o755)
    broker_env = {
        "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
        "HOME": str(broker_dir),
        "JUPYTER_CONFIG_DIR": str(broker_dir / "config"),
        "JUPYTER_RUNTIME_DIR": str(broker_dir / "runtime"),
        "JUPYTER_DATA_DIR": str(broker_dir / "data"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "XDG_CONFIG_DIRS": str(root / "etc" / "xdg"),
        "JUPYTER_GPUSHARE_SIMULATE": SIMULATE,
        "JUPYTER_GPUSHARE_LEDGER_PATH": str(broker_dir / "ledger" / "ledger.sqlite"),
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
    }
    box = TeamBox(
        root,
        run_dir / "broker.sock",
        broker_dir / "ledger" / "ledger.sqlite",
        broker_env,
        user_python(root),
        nofile=nofile,
    )
    try:
        for name in users:
            box.users[name] = create_user(name, root)
        box.start_broker()
        yield box
    finally:
        for server in box.servers:
            server.stop()
        box.stop_broker()
        for user in box.users.values():
            remove_user(user)
        shutil.rmtree(root, ignore_errors=True)
