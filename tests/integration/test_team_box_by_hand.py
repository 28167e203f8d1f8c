"""A team GPU box set up by hand, exactly as docs/admins/team-box.md writes it (issue 25).

The page's own blocks are the script: its ``console`` lines run as root (``#``) or as each user
(``$``), its ``python`` blocks whose first line names a file are written to that file, in the
order the page gives them; a step that cannot be followed fails here. What the page cannot say
for a test machine is substituted, and only that:

* every absolute path it names (``/etc/jupyter-gpushare``, ``/etc/jupyter``, ``/run/…``,
  ``/var/lib/…``, ``/opt/jupyter``) lives under this run's own directory, and the broker is told
  where its configuration directory went (``--config-dir``);
* the installation is this environment's: the install commands (``python3 -m venv``, ``pip
  install``) are not run, ``/opt/jupyter/bin/jupyter`` is a wrapper around a Python every user
  can run, and ``--sys-prefix`` installs into the run's ``/opt/jupyter``;
* the users are this run's own (``alice`` in the page is each of them) and so is the group;
  the service alternative (``systemctl``) is not run; the pool is simulated
  (``JUPYTER_GPUSHARE_SIMULATE`` in the broker's and the users' environments, as the page says
  a machine without a GPU does).

Then the box is used as the page promises: the limits hold, the doctor is green as a user.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError

from ..support.polling import wait_until
from ..support.teambox import OSUser, create_user, remove_user, user_python

pytestmark = pytest.mark.integration

PAGE = Path(__file__).parents[2] / "docs" / "admins" / "team-box.md"
RUN = secrets.token_hex(3)
USERS = (f"gpu-ann-{RUN}", f"gpu-ben-{RUN}")
GROUP = f"gpu-users-{RUN}"
SIMULATE = "1xA100-80GB"
NOT_RUN = re.compile(r"^(python3 -m venv |\S*pip install |systemctl |install -m 0644 examples/systemd)")
# A path the page names, not the tail of another (/opt/jupyter/etc/jupyter is /opt/jupyter's).
ABSOLUTE = re.compile(
    r"(?<![\w.-])(/etc/jupyter-gpushare|/etc/jupyter|/run/jupyter-gpushare|/var/lib/jupyter-gpushare|"
    r"/var/lib/gpushare-team|/opt/jupyter)(?=/|\b|$)"
)
INSTALL = "Install it for every user"
CLI = "import sys; from jupyter_gpushare.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Step:
    who: str  # "root", "user", or "file"
    text: str  # a command line, or a file's content
    path: str = ""  # the file a python block is for
    line: int = 0

    def __str__(self) -> str:
        return f"team-box.md:{self.line}: {self.path or self.text}"


def steps(section: str) -> list[Step]:
    """The steps of one section of the page (``## <section>``), in order."""
    text = PAGE.read_text(encoding="utf-8")
    tokens = MarkdownIt("commonmark").parse(text)
    found: list[Step] = []
    inside = False
    for token in tokens:
        if token.type == "heading_open" and token.tag == "h2":
            inside = False
        if token.type == "inline" and tokens[tokens.index(token) - 1].type == "heading_open":
            inside = inside or token.content == section
        if not inside or token.type != "fence":
            continue
        line = token.map[0] + 1 if token.map else 0
        if token.info == "console":
            for command in token.content.splitlines():
                if command.startswith("# "):
                    found.append(Step("root", command[2:].strip(), line=line))
                elif command.startswith("$ "):
                    found.append(Step("user", command[2:].strip(), line=line))
        elif token.info == "python":
            first, _, rest = token.content.partition("\n")
            match = re.fullmatch(r"# (/\S+)", first.strip())
            if match:
                found.append(Step("file", rest, path=match.group(1), line=line))
    assert found, f"no steps under '## {section}' in {PAGE}"
    return found


@dataclass
class Box:
    root: Path
    python: Path
    users: list[OSUser]
    broker: subprocess.Popen[bytes] | None = None

    def here(self, text: str) -> str:
        """The page's absolute paths under this run's directory; its users and group this run's."""
        text = ABSOLUTE.sub(lambda match: f"{self.root}{match.group(1)}", text)
        text = text.replace("--sys-prefix", f"--prefix {self.root}/opt/jupyter")
        return text.replace("gpu-users", GROUP)

    @property
    def jupyter_wrapper(self) -> Path:
        return self.root / "opt" / "jupyter" / "bin" / "jupyter"

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        return {
            "HOME": str(home),
            "PATH": f"{self.jupyter_wrapper.parent}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "XDG_CONFIG_DIRS": f"{self.root}/etc/xdg",  # not the machine's /etc/xdg/jupyter
            # What a system-wide installation puts on everyone's Jupyter paths: its own
            # etc/jupyter (this run's Python is not the page's /opt/jupyter), then /etc/jupyter.
            "JUPYTER_CONFIG_PATH": f"{self.root}/opt/jupyter/etc/jupyter:{self.root}/etc/jupyter",
            "JUPYTER_PATH": f"{self.root}/opt/jupyter/share/jupyter",
            "JUPYTER_GPUSHARE_SIMULATE": SIMULATE,
            **extra,
        }

    def as_root(self, command: str) -> subprocess.CompletedProcess[str]:
        home = self.root / "root-home"
        return subprocess.run(
            ["bash", "-c", command], env=self.env(home), capture_output=True, text=True, timeout=120
        )

    def as_user(self, user: OSUser, command: list[str] | str) -> subprocess.CompletedProcess[str]:
        """A login of ``user``'s: their uid, gid and the groups they are in now."""
        argv = ["bash", "-c", command] if isinstance(command, str) else command
        return subprocess.run(
            argv,
            env=self.env(user.home, USER=user.name, LOGNAME=user.name),
            capture_output=True,
            text=True,
            timeout=180,
            user=user.uid,
            group=user.gid,
            extra_groups=os.getgrouplist(user.name, user.gid),
            cwd=user.home,
        )

    def start_broker(self, command: str) -> None:
        argv = [*shlex.split(command), "--config-dir", f"{self.root}/etc/jupyter-gpushare"]
        log = (self.root / "broker.log").open("ab")
        self.broker = subprocess.Popen(
            argv, env=self.env(self.root / "root-home"), stdout=log, stderr=subprocess.STDOUT
        )
        socket = next(word for word in argv if word.endswith(".sock"))
        client = BrokerClient(f"unix:{socket}")
        deadline = time.monotonic() + 60
        while True:
            if self.broker.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the broker did not start as the page starts it:\n{self.broker_log()}")
            try:
                client.call("GET", "info")
                return
            except UnreachableError:
                time.sleep(0.1)

    def broker_log(self) -> str:
        path = self.root / "broker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def follow(self, section: str) -> dict[str, subprocess.CompletedProcess[str]]:
        """Run the section's steps in order; what each user's commands answered, by user."""
        answers: dict[str, subprocess.CompletedProcess[str]] = {}
        for step in steps(section):
            if step.who == "file":
                path = Path(self.here(step.path))
                path.write_text(self.here(step.text))  # root's umask: every user may read it
                continue
            if NOT_RUN.match(step.text):
                continue
            command = self.here(step.text)
            if step.who == "root" and " gpushare broker " in f"{command} ":
                self.start_broker(command)
            elif step.who == "root" and re.search(r"\balice\b", command):
                for user in self.users:  # "each user", as the page says
                    done = self.as_root(re.sub(r"\balice\b", user.name, command))
                    assert done.returncode == 0, f"{step}:\n{done.stdout}\n{done.stderr}"
            elif step.who == "root":
                done = self.as_root(command)
                assert done.returncode == 0, f"{step}:\n{done.stdout}\n{done.stderr}"
            else:
                for user in self.users:
                    done = self.as_user(user, command)
                    assert done.returncode == 0, f"{step} as {user.name}:\n{done.stdout}\n{done.stderr}"
                    answers[user.name] = done
        return answers

    def start_kernels(self, user: OSUser, sizes: list[str]) -> list[str]:
        """``user`` starts one "Python 3 (GPU)" kernel per size, holding them all; what each
        start said ("started", or the refusal)."""
        code = f"""
            import asyncio, json
            from jupyter_client.manager import AsyncKernelManager

            async def main():
                said, held = [], []
                for size in {sizes!r}:
                    manager = AsyncKernelManager(kernel_name="python3-gpu")
                    try:
                        await manager.start_kernel(gpu_memory=size)
                        said.append("started")
                        held.append(manager)
                    except Exception as error:
                        said.append(str(error))
                for manager in held:
                    await manager.shutdown_kernel(now=True)
                print(json.dumps(said))

            asyncio.run(main())
        """
        done = self.as_user(user, [str(self.python), "-c", textwrap.dedent(code)])
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout.strip().splitlines()[-1]))

    def hold_kernel(self, user: OSUser, size: str) -> subprocess.Popen[str]:
        """``user``'s process holding one "Python 3 (GPU)" kernel of ``size`` (and the ledger)
        until it is killed; returned once the kernel started."""
        code = f"""
            import asyncio, time
            from jupyter_client.manager import AsyncKernelManager

            async def main():
                manager = AsyncKernelManager(kernel_name="python3-gpu")
                await manager.start_kernel(gpu_memory={size!r})
                print("started", flush=True)
                while True:
                    await asyncio.sleep(1)

            asyncio.run(main())
        """
        holder = subprocess.Popen(
            [str(self.python), "-c", textwrap.dedent(code)],
            env=self.env(user.home, USER=user.name, LOGNAME=user.name),
            stdout=subprocess.PIPE,
            text=True,
            user=user.uid,
            group=user.gid,
            extra_groups=os.getgrouplist(user.name, user.gid),
            cwd=user.home,
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "started":
            holder.kill()
            pytest.fail(f"{user.name}'s kernel did not start (exit {holder.wait(timeout=60)})")
        return holder


@contextlib.contextmanager
def a_fresh_box() -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-by-hand-"))
    root.chmod(0o755)
    (root / "root-home").mkdir()
    for directory in ("etc", "run", "var/lib", "opt/jupyter/bin"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    python = user_python(root)
    box = Box(root, python, [])
    box.jupyter_wrapper.write_text(
        "#!/bin/sh\n# /opt/jupyter/bin/jupyter of the page: this environment's jupyter-gpushare\n"
        'if [ "$1" = gpushare ]; then shift\n'
        f"  exec {python} -c '{CLI}' \"$@\"\nfi\n"
        f'exec {python} -m jupyter "$@"\n'
    )
    box.jupyter_wrapper.chmod(0o755)
    try:
        box.users = [create_user(name, root) for name in USERS]
        yield box
    finally:
        if box.broker is not None and box.broker.poll() is None:
            box.broker.terminate()
            box.broker.wait(timeout=30)
        for user in box.users:
            remove_user(user)
        subprocess.run(["groupdel", GROUP], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_the_team_box_with_the_broker_as_the_page_writes_it() -> None:
    """Failed before: the broker made its socket's directory 0700 (every user "not reachable"),
    ignored /etc/jupyter-gpushare by hand (a 20G kernel under a 16G limit started), and the
    doctor failed as a broker client ("no GPU found", "test kernel: not started")."""
    with a_fresh_box() as box:
        box.follow(INSTALL)
        answers = box.follow("With the GPU broker")
        log = box.broker_log()
        # What the broker says it read is what the page wrote.
        assert f"GPU broker configuration: {box.root}/etc/jupyter-gpushare/jupyter_server_config.py" in log
        assert "max_memory_per_user 24G, max_memory_per_kernel 16G" in log and "admin_users: ada" in log
        assert f"ledger {box.root}/var/lib/jupyter-gpushare/ledger.sqlite" in log
        assert oct((box.root / "run" / "jupyter-gpushare").stat().st_mode & 0o777) == "0o755"
        # The doctor, as each user: green, through the broker.
        for user in box.users:
            report = answers[user.name].stdout
            assert "0 FAIL" in report.splitlines()[-1], report
            assert f"OK    broker: unix:{box.root}/run/jupyter-gpushare/broker.sock" in report
            assert f"you are {user.name}" in report and "OK    test kernel:" in report
            # The page's file names the broker, and is root's: an administrator's for the user.
            admins = f"{box.root}/opt/jupyter/etc/jupyter/jupyter_server_config.py"
            assert f"OK    settings: config files: {admins} (administrator);" in report, report
            assert f"broker_url from {admins}" in report, report
        # The limits hold for each user, whatever their own configuration says.
        ann, ben = box.users
        said = box.start_kernels(ann, ["16G", "20G", "16G"])
        assert said[0] == "started", said
        assert "20G is above the per-kernel limit of 16G" in said[1], said
        assert "per-user limit of 24G" in said[2], said
        assert box.start_kernels(ben, ["16G"]) == ["started"]
        # A socket's directory that lets nobody through is named as the one to fix.
        run = box.root / "run" / "jupyter-gpushare"
        run.chmod(0o700)
        try:
            done = box.as_user(ann, "jupyter gpushare status")
        finally:
            run.chmod(0o755)
        assert done.returncode == 1, done
        assert f"{run} does not let you through (mode 0700, owner root" in done.stderr, done.stderr


def test_the_team_box_with_one_shared_ledger_as_the_page_writes_it() -> None:
    """Failed before: `chgrp gpu-users` with no step creating the group, in the directory the
    broker makes 0700."""
    with a_fresh_box() as box:
        box.follow(INSTALL)
        box.follow("With one shared ledger file")
        ledger = box.root / "var" / "lib" / "gpushare-team" / "ledger.sqlite"
        ann, ben = box.users
        said = box.start_kernels(ann, ["16G", "16G"])
        assert said[0] == "started" and "per-user limit of 24G" in said[1], said
        assert box.start_kernels(ben, ["8G"]) == ["started"]
        # The one ledger, shared through the group (its WAL and lock files too).
        group = grp.getgrnam(GROUP).gr_gid
        assert [path.stat().st_gid for path in ledger.parent.iterdir()] == [group] * len(
            list(ledger.parent.iterdir())
        )
        a_deleted_ledger_is_not_started_afresh_beside_another_users_holder(box, ledger)


def a_deleted_ledger_is_not_started_afresh_beside_another_users_holder(box: Box, ledger: Path) -> None:
    """Ben cannot read the descriptors of Ann's processes (nor anyone's under hidepid): he finds
    her process holding the deleted ledger by the lock sqlite keeps on it, and waits for it
    instead of starting an empty ledger in which her 8G would be free. Failed before: his
    `status` started a new, empty ledger."""
    ann, ben = box.users
    holder = box.hold_kernel(ann, "8G")
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # hung: it cannot put the file back
        ledger.unlink()
        refused = box.as_user(ben, "jupyter gpushare status")
        assert refused.returncode != 0, refused
        assert f"process {holder.pid}" in refused.stderr and "was deleted" in refused.stderr, refused.stderr
        assert not ledger.exists()
        os.kill(holder.pid, signal.SIGCONT)  # it puts the file back within a sampling round
        # (on a loaded machine maybe later than one status waits: asked again until it did)
        seen = wait_until(
            lambda: box.as_user(ben, "jupyter gpushare status --json"),
            timeout=120,
            interval=0.5,
            until=lambda done: done.returncode == 0,
            message="Ben's status once the holder put the ledger back",
        )
        [device] = json.loads(seen.stdout)["pool"]["devices"]
        assert device["memory_reserved"] >= 8 * 2**30, device
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait(timeout=60)
    # Nobody holds it now: deleted with its lock file, it is started afresh by whoever comes
    # first, writable by the group (failed before: Ann was told it is read-only for her).
    for leftover in ledger.parent.glob(f"{ledger.name}*"):
        leftover.unlink()
    assert box.as_user(ben, "jupyter gpushare status").returncode == 0
    assert box.start_kernels(ann, ["8G"]) == ["started"]


def test_the_steps_are_read_from_the_page() -> None:
    broker = steps("With the GPU broker")
    assert [step.path for step in broker if step.who == "file"] == [
        "/etc/jupyter-gpushare/jupyter_server_config.py",
        "/opt/jupyter/etc/jupyter/jupyter_server_config.py",
    ]
    kinds = [
        "broker"
        if " gpushare broker " in step.text
        else "limits"
        if step.path.startswith("/etc/jupyter-gpushare/")
        else "users"
        if step.path.startswith("/opt/jupyter/etc/jupyter/")
        else step.who
        for step in broker
    ]
    # The limits are written before the broker starts; the users are pointed at it after.
    assert kinds.index("limits") < kinds.index("broker") < kinds.index("users")
    assert [step for step in broker if step.who == "user"][-1].text.endswith("gpushare doctor")
    shared = [step.text.split()[0] for step in steps("With one shared ledger file") if step.who == "root"]
    assert shared.index("groupadd") < shared.index("usermod") < shared.index("install")
