"""docs/admins/kubernetes.md (and docs/dra.md's kubectl steps) followed as written, on a fresh
cluster of Kubernetes' own control plane (tests/cluster/) and its real node, with Kubernetes' own
kubectl of the same version (the control plane's binary is also kubectl,
tests/cluster/controlplane/kubectl.go).

The pages' fenced ``bash`` blocks are the script, in the pages' order: every ``kubectl`` line runs
as the page writes it (through bash, cwd the repository root, ``$KUBECONFIG`` the cluster
administrator's); ``jupyter gpushare doctor`` runs as a single-user server would run it — as the
ServiceAccount that rbac.yaml makes (a kubeconfig with its token: the real RBAC decides), with
the environment Zero to JupyterHub gives servers from examples/jupyterhub/z2jh-kernel-pods-values.yaml
— so it starts a test kernel whose pod the real scheduler binds to the real node, where the
kubelet runs it in a container of the kernel image (built from the page's Dockerfile and named as
the page's ``docker build -t`` names it), while the page's ``kubectl get pods ... --watch``
(started before it, as the page says) must list that pod running. What cannot run here is listed
in NOT_RUN with the reason; a command the pages gain that is neither run nor listed fails the test.

The page's GPU sharing layer is HAMi, whose node half (its device plugin and the in-container
limiter) is not served here. The node stands in for it with what HAMi's device plugin is a fork
of: NVIDIA's device plugin over the simulated NVML, time-slicing each card HAMI_SPLIT ways (HAMi's
default split count), and ``nvidia.com/gpumem``/``gpucores`` in the node's status (where the
test cluster's ``hami-scheduler``, a kube-scheduler profile, fits them). So the pod, its
scheduling, its container and its device allocation are real; HAMi's caps inside it are not.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane
from ..cluster.gpu_node import gpu_node
from ..cluster.nodes import gfd_labels
from ..cluster.nvidia_device_plugin import write_config
from ..cluster.rest import NAMESPACES, PODS, SECRETS, SERVICE_ACCOUNTS, Identity
from ..support.nvml_sim import SimulatedCard
from ..support.polling import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "docs" / "admins" / "kubernetes.md", ROOT / "docs" / "dra.md")
VALUES = ROOT / "examples" / "jupyterhub" / "z2jh-kernel-pods-values.yaml"
SINGLEUSER_IMAGE = ROOT / "examples" / "kubernetes" / "singleuser-image" / "Dockerfile"
RELEASE_NAMESPACE = "jupyter"  # `helm upgrade ... -n jupyter`: where the servers run
KERNELS_NAMESPACE = "jupyter-kernels"
CHART_UNREACHABLE = (
    "the Zero to JupyterHub chart comes from hub.jupyter.org, which this network cannot reach "
    "(package registries only); the test gives the doctor the servers' settings from the values "
    "file instead"
)
IMAGES_BUILT = (
    "the kernel image is built from the same Dockerfile and a wheel of this checkout by "
    "tests/cluster/images.py (buildah bud, which takes docker build's arguments; without "
    "EXTRA_PACKAGES=torch, several GB) and named as this command names it in the real node's "
    "containerd; the single-user server is this checkout's environment (the doctor runs from it)"
)
# Commands of the pages that a test cannot run here, by how they begin, with the reason.
NOT_RUN = {
    "pip wheel": "it builds the wheel only for the image build that follows; " + IMAGES_BUILT,
    "docker build": IMAGES_BUILT,
    "docker push": "no registry is reachable here: the node's containerd has the image under its name",
    "helm repo add": CHART_UNREACHABLE,
    "helm repo update": CHART_UNREACHABLE,
    "helm upgrade": CHART_UNREACHABLE,
}
CARD = SimulatedCard("GPU-5e0c1a2b-0000-4000-8000-00000000da7a", "NVIDIA A100-SXM4-80GB", 80 * GiB)
CARD_MIB = CARD.memory_total // 2**20
HAMI_SPLIT = 10  # HAMi's deviceSplitCount: the kernels one card takes
DOCTOR = "jupyter gpushare doctor"
GONE_TIMEOUT = 120.0  # seconds for the test kernel's pod and Secret to go; generous under load


@dataclass(frozen=True)
class Command:
    page: Path
    line: int  # of its block
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def watches(self) -> bool:
        return self.words[0] == "kubectl" and ("--watch" in self.words or "-w" in self.words)


def page_commands(page: Path) -> Iterator[Command]:
    """The commands of ``page``'s ``bash`` blocks in order: continuations joined, each side of
    ``&&`` its own command, blank and comment-only lines dropped."""
    for token in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8")):
        if token.type != "fence" or token.info.split()[:1] != ["bash"]:
            continue
        line = token.map[0] + 1 if token.map else 0
        for text in token.content.replace("\\\n", " ").splitlines():
            for part in text.split("&&"):
                if shlex.split(part, comments=True):
                    yield Command(page, line, part.strip())


def not_run_reason(command: Command) -> str | None:
    words = command.words
    return next(
        (reason for start, reason in NOT_RUN.items() if words[: len(start.split())] == start.split()), None
    )


def runs_here(command: Command) -> bool:
    return command.words[0] == "kubectl" or " ".join(command.words) == DOCTOR


def test_every_command_of_the_pages_is_run_or_listed_as_not_runnable() -> None:
    commands = [command for page in PAGES for command in page_commands(page)]
    unknown = [str(c) for c in commands if not runs_here(c) and not_run_reason(c) is None]
    assert not unknown, f"commands the pages give that this test neither runs nor lists in NOT_RUN: {unknown}"
    # The steps this test exists for are on the page (a reworded page must not leave it empty).
    texts = [command.text for command in commands]
    assert "kubectl apply -f examples/kubernetes/rbac.yaml" in texts
    assert "kubectl apply -f examples/kubernetes/networkpolicy-kernels.yaml" in texts
    assert DOCTOR in texts
    assert any(command.watches for command in commands)


def test_an_unlisted_command_is_caught() -> None:
    strange = Command(PAGES[0], 1, "kind create cluster")
    assert not runs_here(strange) and not_run_reason(strange) is None
    assert not_run_reason(Command(PAGES[0], 1, "helm repo update")) == CHART_UNREACHABLE


def server_environment(home: Path, kubeconfig: Path, path: str) -> dict[str, str]:
    """What a single-user server's terminal has under the values file: its ``extraEnv`` (read
    from the file, not copied), the ServiceAccount's credentials, a home of its own."""
    values = yaml.safe_load(VALUES.read_text())
    extra = {name: str(value) for name, value in values["singleuser"]["extraEnv"].items()}
    return {
        "PATH": path,
        "HOME": str(home),
        "KUBECONFIG": str(kubeconfig),
        "JUPYTER_PLATFORM_DIRS": "1",
        "XDG_CONFIG_DIRS": str(home / ".system-config"),  # not the machine's /etc/jupyter
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / ".local" / "share" / "jupyter" / "runtime"),
        "JUPYTERHUB_USER": "alice",
        "LANG": "C.UTF-8",
        **extra,
    }


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Path]]:
    """A control plane of its own (the page starts from a fresh cluster, no namespace of ours
    in it), its real node as the page's GPU node (HAMI_NODE), and a directory with ``kubectl``
    (the control plane's binary under that name)."""
    root = tmp_path_factory.mktemp("kubernetes-page")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    values = yaml.safe_load(VALUES.read_text())
    image = values["singleuser"]["extraEnv"]["JUPYTER_GPUSHARE_KERNEL_IMAGE"]
    with ControlPlane(root / "controlplane") as plane:
        (bin_dir / "kubectl").symlink_to(plane.binary)
        config = write_config(root / "device-plugin.yaml", HAMI_SPLIT)
        with gpu_node(
            plane,
            root / "gpu-node",
            [CARD],
            config,
            ("nvidia.com/gpu", HAMI_SPLIT),
            labels=gfd_labels(memory_mib=CARD_MIB, replicas=HAMI_SPLIT),
            image_names=[image],  # step 1's `docker build -t`
            extended_resources={"nvidia.com/gpumem": str(CARD_MIB), "nvidia.com/gpucores": "100"},
        ):
            yield plane, bin_dir


def run(
    command: Command, env: dict[str, str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``command`` through bash, as typed at a prompt in the repository root."""
    done = subprocess.run(
        ["bash", "-c", command.text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert not check or done.returncode == 0, (
        f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return done


DOCTOR_LINE = re.compile(r"^(OK|WARN|FAIL)\s+([^:]+): (.*)$", re.MULTILINE)
# The kernel image is built without frameworks (NOT_RUN: no EXTRA_PACKAGES): a test kernel that
# says so ran in the image, not in this checkout's environment.
IN_THE_IMAGE = "PyTorch not installed: framework check skipped"


def check_doctor(done: subprocess.CompletedProcess[str]) -> None:
    """The doctor, as the server's account under the shipped RBAC, reached the cluster, was
    allowed what kernels need, saw the nodes' GPUs, and its test kernel ran in a container of
    the kernel image with the card NVIDIA's device plugin allocated on the real node."""
    lines = {name: (status, text) for status, name, text in DOCTOR_LINE.findall(done.stdout)}
    report = f"the doctor's report:\n{done.stdout}\n{done.stderr}"
    failed = [name for name, (status, _) in lines.items() if status == "FAIL"]
    assert not failed and done.returncode == 0, report
    for name in ("cluster", "RBAC", "GPU resources", "kernelspecs", "test kernel"):
        assert lines.get(name, ("missing",))[0] == "OK", report
    text = lines["test kernel"][1]
    assert text.startswith(f"NVIDIA_VISIBLE_DEVICES={CARD.uuid}, slice 512 MiB"), report
    assert IN_THE_IMAGE in text, report


def test_the_kubernetes_pages_commands_run_in_order_on_a_cluster_with_a_real_node(
    fresh_cluster: tuple[ControlPlane, Path], tmp_path: Path
) -> None:
    plane, bin_dir = fresh_cluster
    path = os.pathsep.join(
        [str(bin_dir), str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
    )
    admin_env = {"PATH": path, "HOME": str(tmp_path), "KUBECONFIG": str(plane.admin_kubeconfig)}
    assert plane.admin.get(NAMESPACES, KERNELS_NAMESPACE) is None  # fresh: the page makes it
    version = run(Command(PAGES[0], 0, "kubectl version"), admin_env).stdout
    assert f"Client Version: {plane.version}" in version and f"Server Version: {plane.version}" in version

    ran, watch = [], None
    try:
        for page in PAGES:
            for command in page_commands(page):
                if not runs_here(command):
                    continue
                if command.watches:  # "meanwhile, watch": it runs until the test kernel came and went
                    watch = subprocess.Popen(
                        ["bash", "-c", f"exec {command.text}"],
                        cwd=ROOT,
                        env=admin_env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        start_new_session=True,
                    )
                elif command.words[0] == "kubectl":
                    run(command, admin_env)
                else:
                    assert watch is not None, f"{command}: the page gives no watch before it"
                    check_doctor(run(command, doctor_environment(plane, tmp_path, path), 600, check=False))
                ran.append(command.text)
        # The doctor shut its kernel down: pod and Secret go (the watch sees the pod go too).
        wait_until(
            lambda: (
                not plane.admin.list(PODS, KERNELS_NAMESPACE)
                and not plane.admin.list(SECRETS, KERNELS_NAMESPACE)
            ),
            timeout=GONE_TIMEOUT,
            message="the test kernel's pod and Secret deleted",
        )
    finally:
        if watch is not None and watch.poll() is None:
            os.killpg(watch.pid, signal.SIGINT)  # Ctrl-C, as the page says
        seen = watch.communicate(timeout=30)[0] if watch is not None else ""
    assert DOCTOR in ran and watch is not None, ran
    # The watch listed the test kernel's pod running, as an administrator sees it come and go.
    assert re.search(r"^gpushare-kernel-\S+\s+\d/\d\s+Running\b", seen, re.MULTILINE), seen


def doctor_environment(plane: ControlPlane, tmp_path: Path, path: str) -> dict[str, str]:
    """The single-user server's terminal: rbac.yaml's ServiceAccount (which the page must have
    made: no test makes it), through a kubeconfig with its token, in the release's namespace; the
    values file's environment; the kernelspec the single-user image installs."""
    account = plane.admin.get(SERVICE_ACCOUNTS, "jupyter-gpushare", RELEASE_NAMESPACE)
    assert account is not None, "the page's RBAC step made no ServiceAccount jupyter-gpushare"
    values = yaml.safe_load(VALUES.read_text())
    assert values["singleuser"]["serviceAccountName"] == account["metadata"]["name"]
    token = plane.service_account_token(RELEASE_NAMESPACE, "jupyter-gpushare")
    kubeconfig = plane.kubeconfig(
        tmp_path / "server.kubeconfig", Identity(plane.server, plane.ca, token=token), RELEASE_NAMESPACE
    )
    home = tmp_path / "home"
    home.mkdir()
    env = server_environment(home, kubeconfig, path)
    # The image's own step, into this home rather than this environment's prefix (shared with
    # the other tests).
    install = re.search(r"jupyter gpushare kernelspec install[^\\&\n]*", SINGLEUSER_IMAGE.read_text())
    assert install is not None, f"{SINGLEUSER_IMAGE} installs no gpushare kernelspec"
    run(Command(SINGLEUSER_IMAGE, 0, install.group().replace("--sys-prefix", "--user")), env)
    return env
