"""The GPU broker as a JupyterHub service on Kubernetes' own control plane (docs/broker.md, Kubernetes).

A real JupyterHub (configurable-http-proxy, local spawner) with two users, ``alice`` and ``bob``;
the broker runs as an external hub service holding the only kubeconfig (the Jupyter server's
ServiceAccount under the shipped RBAC, examples/kubernetes/rbac.yaml); the single-user servers
get the broker's URL and nothing of the cluster. One simulated node with 16G of HAMi GPU memory,
its pods bound by the real kube-scheduler; the broker's limit is 12G per user. One hub, one
broker and one cluster serve the module; the tests run in order on what the earlier ones left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import OWNER_LABEL, pod_name, secret_name
from jupyter_gpushare.core.capabilities import KERNEL_PODS
from jupyter_gpushare.core.sizes import GiB

from ..cluster import ControlPlane, KubeCluster, hami_nodes
from ..cluster.rest import PODS, SECRETS, Api, ApiError
from ..support.hermetic import isolated_from_the_machine
from ..support.hub import ADMIN_TOKEN, HUB_BASE, Hub, proxy_command
from ..support.json_http import json_call
from ..support.nodes import BIN, IMAGE
from ..support.polling import wait_until
from ..support.servers import JupyterServer, execute, free_port
from ..support.teambox import LEAN_SERVER
from .conftest import module_kube

pytestmark = pytest.mark.integration

BROKER_TOKEN = "gpushare-broker-service-token"
API = "api/gpushare"
ORPHAN_GRACE = 3.0

HUB_CONFIG = (
    HUB_BASE
    + """
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{root}/home/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.ip = {server_ip!r}
c.Spawner.args = ["--allow-root", "--KubernetesProvisioner.poll_interval=0.1"]
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.Spawner.environment = {environment!r}
c.JupyterHub.services = [
    {{"name": "tests", "api_token": {admin_token!r}}},
    {{"name": "gpushare-broker", "url": "http://127.0.0.1:{broker_port}", "api_token": {broker_token!r}}},
]
c.JupyterHub.load_roles = [{{
    "name": "tests",
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "read:users"],
    "services": ["tests"],
}}]
"""
)


@dataclass
class Setup:
    hub: Hub
    cluster: KubeCluster
    broker_url: str
    broker_env: dict[str, str]
    root: Path
    broker: subprocess.Popen[bytes] | None = None
    tokens: dict[str, str] = field(default_factory=dict)  # a token per user, their server started
    # How the broker's command line starts (a fault test runs it with shorter timeouts).
    launcher: tuple[str, ...] = (str(BIN / "jupyter-gpushare"),)

    def start_broker(self) -> None:
        port = self.broker_url.rsplit(":", 1)[1].rstrip("/")
        self.broker = subprocess.Popen(
            [
                *self.launcher,
                "broker",
                "--backend",
                "kubernetes",
                "--ip",
                "127.0.0.1",
                "--port",
                port,
            ],
            env=self.broker_env,
            stdout=(self.root / "broker.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:  # up once it answers at all (401: it wants a token)
            if self.broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start:\n{self.log()}")
            try:
                json_call(f"{self.broker_url}api/gpushare/broker/info", timeout=2)
                return
            except OSError:
                time.sleep(0.1)

    def log(self) -> str:
        return (self.root / "broker.log").read_text(errors="replace")


@contextlib.contextmanager
def hub_and_broker(
    root: Path,
    cluster: KubeCluster,
    kernelspecs: dict[str, dict[str, Any]],
    preset: str,
    gpushare: dict[str, Any],
    launcher: tuple[str, ...] = (),
    kernel_image: str = IMAGE,
    server_ip: str = "127.0.0.1",
) -> Iterator[Setup]:
    """A hub whose users' servers know only the broker's URL, and the broker (``preset``, the
    broker's ``gpushare`` settings; its command line started by ``launcher`` when given) holding
    ``cluster``'s kubeconfig; the ``kernelspecs`` (name: the provisioner's config) installed for
    every server. The users' servers listen on ``server_ip`` (where their kernel pods reach them),
    and their pods run ``kernel_image``."""
    prefix = root / "prefix" / "share" / "jupyter"
    for name, provisioner_config in kernelspecs.items():
        directory = prefix / "kernels" / name
        directory.mkdir(parents=True)
        spec = {
            "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": name,
            "language": "python",
            "metadata": {
                "kernel_provisioner": {
                    "provisioner_name": "gpushare-provisioner",
                    "config": provisioner_config,
                }
            },
        }
        (directory / "kernel.json").write_text(json.dumps(spec))
    server_config = root / "server-config"
    server_config.mkdir()
    (server_config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": LEAN_SERVER}})
    )
    broker_config = root / "broker-config"
    broker_config.mkdir()
    (broker_config / "jupyter_server_config.json").write_text(
        json.dumps({"GPUShare": gpushare, "GPUShareBroker": {"orphan_grace": ORPHAN_GRACE}})
    )
    broker_port, hub_port, port = free_port(), free_port(), free_port()
    broker_url = f"http://127.0.0.1:{broker_port}/"
    environment = {
        "JUPYTER_PATH": str(prefix),
        "JUPYTER_CONFIG_DIR": str(server_config),
        "JUPYTER_GPUSHARE_BACKEND": "kubernetes",
        "JUPYTER_GPUSHARE_BROKER_URL": broker_url,
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
        **isolated_from_the_machine(),  # a spawner passes only what it is given
    }
    (root / "hub" / "home").mkdir(parents=True)
    config = root / "hub" / "jupyterhub_config.py"
    config.write_text(
        HUB_CONFIG.format(
            port=port,
            hub_port=hub_port,
            proxy_api_port=free_port(),
            proxy=proxy_command(),
            root=root / "hub",
            singleuser=str(BIN / "jupyterhub-singleuser"),
            server_ip=server_ip,
            environment=environment,
            admin_token=ADMIN_TOKEN,
            broker_port=broker_port,
            broker_token=BROKER_TOKEN,
        )
    )
    # Nothing of the cluster reaches the hub, hence its single-user servers.
    hub_env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "JUPYTER_GPUSHARE"))}
    hub_env["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    hub_log = root / "hub" / "hub.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(config)],
        cwd=root / "hub",
        env=hub_env,
        stdout=hub_log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    hub = Hub(f"http://127.0.0.1:{port}", process, hub_log)
    broker_env = {
        "PATH": hub_env["PATH"],
        "HOME": str(root),
        "KUBECONFIG": str(cluster.kubeconfig),
        "JUPYTER_CONFIG_DIR": str(broker_config),
        "JUPYTER_RUNTIME_DIR": str(root / "broker-runtime"),
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api",
        "JUPYTERHUB_API_TOKEN": BROKER_TOKEN,
        "JUPYTERHUB_SERVICE_NAME": "gpushare-broker",
        "JUPYTER_GPUSHARE_RESOURCE_PRESET": preset,
        "JUPYTER_GPUSHARE_KERNEL_IMAGE": kernel_image,
        "JUPYTER_GPUSHARE_NAMESPACE": cluster.namespace,
        "JUPYTER_GPUSHARE_SAMPLE_INTERVAL": "0.5",
        **isolated_from_the_machine(),
    }
    made = Setup(hub, cluster, broker_url, broker_env, root)
    if launcher:
        made.launcher = launcher
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"jupyterhub exited:\n{hub_log.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                if hub.call("GET", "/hub/api/")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyterhub did not answer:\n{hub_log.read_text()[-4000:]}")
            time.sleep(0.3)
        made.start_broker()
        yield made
    finally:
        for user in ("alice", "bob"):
            with contextlib.suppress(OSError):
                hub.call("DELETE", f"/hub/api/users/{user}/server")
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if made.broker is not None and made.broker.poll() is None:
            made.broker.terminate()
            made.broker.wait(timeout=30)


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, kube_namespace: str
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("broker-k8s")
    kernelspecs = {
        "gpu-6g-vgpu": {"gpu_memory": "6G", "gpu_mode": "vgpu"},
        "gpu-2g-vgpu": {"gpu_memory": "2G", "gpu_mode": "vgpu"},
    }
    nodes = hami_nodes(1, gpumem_mib=16384, card_mib=16384)
    with (
        module_kube(control_plane, kube_namespace, root / "cluster", nodes) as cluster,
        hub_and_broker(root, cluster, kernelspecs, "hami", {"max_memory_per_user": "12G"}) as made,
    ):
        yield made


def user_token(setup: Setup, user: str) -> str:
    """A token of ``user``'s, their server started (once per module)."""
    if user in setup.tokens:
        return setup.tokens[user]
    hub = setup.hub
    assert hub.call("POST", f"/hub/api/users/{user}")[0] in (201, 409)
    status, body = hub.call("POST", f"/hub/api/users/{user}/server")
    assert status in (201, 202), body
    deadline = time.monotonic() + 120
    while not ((hub.call("GET", f"/hub/api/users/{user}")[1].get("servers") or {}).get("") or {}).get(
        "ready"
    ):
        assert time.monotonic() < deadline, f"{user}'s server did not start:\n{hub.log.read_text()[-4000:]}"
        time.sleep(0.3)
    status, token = hub.call("POST", f"/hub/api/users/{user}/tokens", {"note": "gpushare test"})
    assert status in (200, 201), token
    setup.tokens[user] = str(token["token"])
    return setup.tokens[user]


def call(setup: Setup, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return setup.hub.call(method, f"/user/{user}/{API}/{path}", body, token=user_token(setup, user))


def on_broker(setup: Setup, token: str | None, method: str, route: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"token {token}"} if token else {}
    return json_call(
        f"{setup.broker_url}api/gpushare/broker/{route}", method, body, headers=headers, timeout=30
    )


def server_of(setup: Setup, user: str) -> JupyterServer:
    """The user's server as the tests' websocket helper reaches it (through the proxy)."""
    return JupyterServer(
        subprocess.Popen(["true"]), f"{setup.hub.url}/user/{user}", user_token(setup, user), setup.hub.log
    )


def single_user_processes(setup: Setup, user: str) -> list[psutil.Process]:
    """``user``'s single-user servers of this hub (another run's hub may have an alice too)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            singleuser = any("jupyterhub-singleuser" in part for part in process.info["cmdline"] or [])
            environ = process.environ() if singleuser else {}
            if environ.get("JUPYTERHUB_USER") == user and (
                environ.get("JUPYTER_GPUSHARE_BROKER_URL") == setup.broker_url
            ):
                found.append(process)
    return found


def running(setup: Setup, user: str, kernel_id: str) -> dict[str, Any]:
    """The kernel's view once it runs and the user's jupyter_server knows it too (it lists a pod
    kernel a moment after the pod runs: a DELETE of api/kernels in between is a 404)."""
    view = wait_until(
        lambda: (lambda answer: answer[1] if answer[0] == 200 and answer[1]["state"] == "running" else None)(
            call(setup, user, "GET", f"kernels/{kernel_id}")
        ),
        timeout=120,  # a pod's start on a busy 2-core machine
    )
    token = user_token(setup, user)
    wait_until(
        lambda: setup.hub.call("GET", f"/user/{user}/api/kernels/{kernel_id}", token=token)[0] == 200,
        timeout=120,
    )
    return dict(view)


def test_users_start_kernel_pods_through_the_broker_holding_no_cluster_credentials(setup: Setup) -> None:
    alice = call(setup, "alice", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    bob = call(setup, "bob", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    assert alice[0] in (201, 202) and bob[0] in (201, 202), (alice, bob, setup.log()[-3000:])
    alices, bobs = alice[1]["kernel_id"], bob[1]["kernel_id"]
    running(setup, "alice", alices)
    running(setup, "bob", bobs)
    owners = {pod["metadata"]["name"]: pod["metadata"]["labels"][OWNER_LABEL] for pod in setup.cluster.pods()}
    assert owners == {pod_name(alices): "alice", pod_name(bobs): "bob"}

    # The servers have no kubeconfig, no service account token, no cluster address.
    for user in ("alice", "bob"):
        [process] = single_user_processes(setup, user)
        environ = process.environ()
        assert not [name for name in environ if name.startswith("KUBE")], environ
        home = Path(environ["HOME"])
        assert not (home / ".kube").exists()
        assert not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()

    # Each sees their own kernel; the other's pod is anonymous occupancy.
    kernels = call(setup, "alice", "GET", "kernels")[1]
    assert [view["kernel_id"] for view in kernels] == [alices]
    # What a pod can do, as the broker says it offers (not told from its kind's name).
    assert kernels[0]["capabilities"] == KERNEL_PODS.payload(), kernels
    # Bob's pod reaches alice's server with the broker's next event (within a sample).
    pool = wait_until(
        lambda: (lambda p: p if p["devices"][0]["memory_reserved"] == 12 * GiB else None)(
            call(setup, "alice", "GET", "pool")[1]
        ),
        timeout=60,
    )
    assert bobs not in str(pool) + str(kernels)
    # Neither can reach the other's pod through the broker.
    token = user_token(setup, "alice")
    for method, route in (
        ("GET", f"pods/{bobs}"),
        ("DELETE", f"pods/{bobs}"),
        ("DELETE", f"slices/{bobs}/gpu"),
    ):
        assert on_broker(setup, token, method, route)[0] == 404, route
    assert {pod["metadata"]["name"] for pod in setup.cluster.pods()} == {pod_name(alices), pod_name(bobs)}
    # The kernel answers.
    out, _ = asyncio.run(execute(server_of(setup, "alice"), alices, "print(6 * 7)"))
    assert out.strip() == "42"


def test_a_single_user_servers_identity_is_refused_pods_and_secrets_by_the_api_server(setup: Setup) -> None:
    """Were a single-user server given the namespace's ServiceAccount (a pod's default) or
    a user's own certificate, the shipped RBAC grants it nothing: the real API server refuses
    it the kernel pods and their Secrets (connection keys), so only the broker reaches them."""
    cluster = setup.cluster
    [pod, *_] = cluster.pods()
    [secret, *_] = cluster.secrets()
    identities = [
        cluster.kubeconfig_for_service_account(cluster.namespace, "default"),
        cluster.kubeconfig_for_user("alice", ["jupyterhub-users"]),
    ]
    namespace = cluster.namespace
    kernel_pod, kernel_secret = pod["metadata"]["name"], secret["metadata"]["name"]
    attempts: dict[str, Callable[[Api], object]] = {
        "list pods": lambda api: api.list(PODS, namespace),
        "get a pod": lambda api: api.get(PODS, kernel_pod, namespace),
        "create a pod": lambda api: api.create(PODS, {"metadata": {"name": "mine"}}, namespace),
        "delete a pod": lambda api: api.delete(PODS, kernel_pod, namespace),
        "list Secrets": lambda api: api.list(SECRETS, namespace),
        "read a Secret": lambda api: api.get(SECRETS, kernel_secret, namespace),
    }
    for kubeconfig in identities:
        api = cluster.api_as(kubeconfig)
        try:
            for attempt, act in attempts.items():
                with pytest.raises(ApiError) as refused:
                    act(api)
                assert refused.value.status == 403, (kubeconfig.name, attempt)
                assert "forbidden" in refused.value.message, refused.value.message
        finally:
            api.close()
    # Nothing changed: the kernels' pods and Secrets are as they were.
    assert pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in cluster.pods()}


def test_one_fifo_queue_and_the_quotas_hold_across_users(setup: Setup) -> None:
    [alices] = [view["kernel_id"] for view in call(setup, "alice", "GET", "kernels")[1]]
    [bobs] = [view["kernel_id"] for view in call(setup, "bob", "GET", "kernels")[1]]
    # 12G of 16G is held: a third 6G kernel waits, first in the queue; no pod is made for it.
    third = call(setup, "alice", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    assert third[0] == 202 and third[1]["state"] == "queued", third
    waiting = third[1]["kernel_id"]
    view = wait_until(
        lambda: (lambda v: v if "position 1" in str(v.get("detail")) else None)(
            call(setup, "alice", "GET", f"kernels/{waiting}")[1]
        )
    )
    assert "does not fit now" in view["detail"], view
    assert pod_name(waiting) not in {pod["metadata"]["name"] for pod in setup.cluster.pods()}
    # Bob's second waits behind it, across users; alice's fourth is over her 12G (6G held + 6G
    # waiting), and is refused at once.
    bob_second = call(setup, "bob", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    assert bob_second[0] == 202, bob_second
    wait_until(
        lambda: "position 2" in str(call(setup, "bob", "GET", f"kernels/{bob_second[1]['kernel_id']}")[1])
    )
    fourth = call(setup, "alice", "POST", "kernels", {"name": "gpu-2g-vgpu"})
    assert fourth[0] == 409 and "per-user limit of 12G" in fourth[1]["message"], fourth
    # Bob's first kernel ends: alice's waiting one is admitted and runs; bob's moves up.
    assert setup.hub.call("DELETE", f"/user/bob/api/kernels/{bobs}", token=user_token(setup, "bob"))[0] == 204
    running(setup, "alice", waiting)
    wait_until(
        lambda: "position 1" in str(call(setup, "bob", "GET", f"kernels/{bob_second[1]['kernel_id']}")[1])
    )
    # Bob withdraws his; alice's second kernel ends too.
    assert call(setup, "bob", "DELETE", f"kernels/{bob_second[1]['kernel_id']}/gpu")[0] == 204
    assert (
        setup.hub.call("DELETE", f"/user/alice/api/kernels/{waiting}", token=user_token(setup, "alice"))[0]
        == 204
    )
    wait_until(
        lambda: {pod["metadata"]["name"] for pod in setup.cluster.pods()} == {pod_name(alices)}, timeout=60
    )


def test_a_starting_kernels_long_ask_is_answered_when_its_start_moves_on(setup: Setup) -> None:
    """A server asks after its starting kernel with long asks (``GET pods/{id}?wait=S&seen=MARK``):
    the broker holds an ask while the start stands as the caller last heard (its ``mark``) and
    answers it as soon as the start moves on, so a start costs a few answers, not one per poll."""
    [alices] = [view["kernel_id"] for view in call(setup, "alice", "GET", "kernels")[1]]
    token = user_token(setup, "bob")
    # A start that fits, with nothing ahead of it, is admitted as it comes, and the POST is
    # answered once its pod exists: the answer says what the watch will show (not "creating"),
    # and the API server has the pod when the answer arrives.
    direct = str(uuid.uuid4())
    ask = {"kernel_id": direct, "gpu_memory": "2G", "gpu_mode": "vgpu", "argv": ["sleep", "600"]}
    status, made = on_broker(setup, token, "POST", "pods", {**ask, "token": "t" * 32})
    assert status == 202 and made["state"] in ("starting", "running"), made
    assert made["detail"] != "creating the kernel pod", made
    assert pod_name(direct) in {pod["metadata"]["name"] for pod in setup.cluster.pods()}
    assert on_broker(setup, token, "DELETE", f"pods/{direct}?grace=0")[0] == 200
    wait_until(
        lambda: pod_name(direct) not in {pod["metadata"]["name"] for pod in setup.cluster.pods()}, timeout=60
    )
    bob = call(setup, "bob", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    assert bob[0] in (201, 202), bob
    bobs = bob[1]["kernel_id"]
    running(setup, "bob", bobs)  # 12G of 16G held: alice's next 6G waits, bob's 2G behind it
    ahead = call(setup, "alice", "POST", "kernels", {"name": "gpu-6g-vgpu"})
    behind = call(setup, "bob", "POST", "kernels", {"name": "gpu-2g-vgpu"})
    assert ahead[0] == 202 and behind[0] == 202, (ahead, behind)
    waiting = behind[1]["kernel_id"]
    now = wait_until(
        lambda: (lambda a: a[1] if a[0] == 200 and "position 2" in str(a[1].get("detail")) else None)(
            on_broker(setup, token, "GET", f"pods/{waiting}")
        )
    )
    # Nothing moves: the ask is held for its wait, then answered as it stands.
    began = time.monotonic()
    status, same = on_broker(setup, token, "GET", f"pods/{waiting}?wait=1.5&seen={now['mark']}")
    assert status == 200 and same["mark"] == now["mark"], same
    assert time.monotonic() - began >= 1.5
    # Alice withdraws hers: bob's start moves on (it fits now), and his held ask is answered
    # then, long before its 25 s.
    asks = ThreadPoolExecutor(max_workers=1)
    asked = asks.submit(on_broker, setup, token, "GET", f"pods/{waiting}?wait=25&seen={now['mark']}")
    began = time.monotonic()
    assert call(setup, "alice", "DELETE", f"kernels/{ahead[1]['kernel_id']}/gpu")[0] == 204
    status, moved = asked.result(timeout=60)
    took = time.monotonic() - began
    asks.shutdown()
    assert status == 200 and moved["mark"] != now["mark"] and "position 2" not in str(moved), moved
    assert took < 20, f"the long ask was answered after {took:.1f} s, not when the start moved on"
    # A wait that is not a number of seconds is refused, said.
    for wait in ("soon", "-1", "nan"):
        status, body = on_broker(setup, token, "GET", f"pods/{waiting}?wait={wait}")
        assert status == 400 and "wait must be a number of seconds" in body["message"], (wait, body)
    running(setup, "bob", waiting)
    for kernel_id in (bobs, waiting):
        assert setup.hub.call("DELETE", f"/user/bob/api/kernels/{kernel_id}", token=token)[0] == 204
    wait_until(
        lambda: {pod["metadata"]["name"] for pod in setup.cluster.pods()} == {pod_name(alices)}, timeout=60
    )


def test_tokens_the_hub_does_not_accept_are_refused(setup: Setup) -> None:
    status, body = on_broker(setup, None, "GET", "pool")
    assert status == 401 and "JupyterHub API token" in body["message"]
    status, body = on_broker(setup, "not-a-token", "GET", "pool")
    assert status == 403 and "does not accept this API token" in body["message"]
    status, made = setup.hub.call("POST", "/hub/api/users/alice/tokens", {"expires_in": 1, "note": "short"})
    assert status in (200, 201), made
    time.sleep(1.5)
    status, body = on_broker(setup, made["token"], "GET", "pool")
    assert status == 403 and "expired" in body["message"]
    # Bad input answers 4xx, never 500.
    token = user_token(setup, "alice")
    for method, route, payload in (
        ("POST", "pods", {"kernel_id": "../x"}),
        ("POST", "pods", {"kernel_id": "abc", "argv": [], "token": "x"}),
        ("POST", "pods", ["not", "an", "object"]),
        ("POST", "check", {"gpu_memory": True}),
        ("POST", "check", {"gpu_memory": "lots"}),
        ("DELETE", "pods/abc?grace=soon", None),
        ("POST", "server-kernels", {"kernels": {"ids": "all"}}),
        ("GET", "nothing-here", None),
    ):
        status, body = on_broker(setup, token, method, route, payload)
        assert 400 <= status < 500 and body["message"], (route, payload, status, body)


def test_a_broker_killed_mid_start_leaves_no_orphan_and_loses_no_kernel(setup: Setup) -> None:
    [alices] = [view["kernel_id"] for view in call(setup, "alice", "GET", "kernels")[1]]
    answers: list[tuple[int, Any]] = []
    starter = threading.Thread(
        target=lambda: answers.append(call(setup, "bob", "POST", "kernels", {"name": "gpu-2g-vgpu"}))
    )
    starter.start()
    # The moment the broker has created the new pod, it dies.
    wait_until(lambda: len(setup.cluster.pods()) == 2, timeout=60, interval=0.01)
    assert setup.broker is not None
    setup.broker.send_signal(signal.SIGKILL)
    setup.broker.wait()
    starter.join(timeout=60)
    [(status, body)] = answers
    if status == 202:  # answered "starting" before the broker died: the start failed since
        body = wait_until(
            lambda: (lambda a: a[1] if a[0] == 503 else None)(
                call(setup, "bob", "GET", f"kernels/{body['kernel_id']}")
            )
        )
        status = 503
    assert status == 503 and "is not reachable" in body["message"], (status, body)
    [lost] = [
        pod["metadata"]["name"] for pod in setup.cluster.pods() if pod["metadata"]["name"] != pod_name(alices)
    ]
    setup.start_broker()
    # Nobody asks after the lost start's pod: the restarted broker deletes it and its Secret.
    wait_until(
        lambda: [p["metadata"]["name"] for p in setup.cluster.pods()] == [pod_name(alices)], timeout=60
    )
    wait_until(
        lambda: {s["metadata"]["name"] for s in setup.cluster.secrets()} == {secret_name(alices)}, timeout=60
    )
    assert lost != pod_name(alices)
    # Alice's kernel, started before the broker died, runs on and is listed (once the restarted
    # broker's watch has seen its pod again).
    wait_until(
        lambda: [(view["kernel_id"], view["state"]) for view in call(setup, "alice", "GET", "kernels")[1]],
        timeout=120,
        message="alice's kernel listed as running by the restarted broker",
        until=lambda views: views == [(alices, "running")],
    )
    out, _ = asyncio.run(execute(server_of(setup, "alice"), alices, "print(6 * 7)"))
    assert out.strip() == "42"
    # And the restarted broker resizes it by restart: a new pod of the new size, same kernel.
    old_ip = setup.cluster.pods()[0]["status"]["podIP"]
    resized = call(setup, "alice", "PATCH", f"kernels/{alices}", {"gpu_memory": "4G", "restart": True})
    assert resized[0] == 200 and resized[1]["memory_request"] == 4 * GiB, resized
    [pod] = setup.cluster.pods()
    assert pod["status"]["podIP"] != old_ip
    out, _ = asyncio.run(execute(server_of(setup, "alice"), alices, "print(6 * 7)"))
    assert out.strip() == "42"


def test_the_broker_accounts_every_users_kernel_pods_and_each_sees_their_own(setup: Setup) -> None:
    """The broker keeps the accounting on Kubernetes (its pod watch, into its own file): a kernel
    pod's hold is what it reserved from its placement to its end, to the broker's housekeeping
    round (2 s), through ``GET usage`` of the user's own server, ``usage/totals`` and the
    ``report`` command; a user sees their own rows only. The holds of the tests above (before and
    after the broker was killed and restarted) are in it too."""
    bob = call(setup, "bob", "POST", "kernels", {"name": "gpu-2g-vgpu"})
    assert bob[0] in (201, 202), bob
    posted = time.time()
    bobs = bob[1]["kernel_id"]
    running(setup, "bob", bobs)
    seen_running = time.time()
    # A cell runs about 3 s of the hold: the kernel tells its server, which tells the broker.
    out, _ = asyncio.run(execute(server_of(setup, "bob"), bobs, "import time; time.sleep(3); print('slept')"))
    assert out.strip() == "slept"
    time.sleep(max(0.0, seen_running + 8 - time.time()))  # held: 2G for about 8 s
    deleted = time.time()
    assert setup.hub.call("DELETE", f"/user/bob/api/kernels/{bobs}", token=user_token(setup, "bob"))[0] == 204
    wait_until(
        lambda: pod_name(bobs) not in {p["metadata"]["name"] for p in setup.cluster.pods()}, timeout=60
    )
    gone = time.time()

    def bobs_row() -> dict[str, Any] | None:
        status, usage = call(setup, "bob", "GET", "usage?since=1h&by=kernel")
        assert status == 200, usage
        row = next((row for row in usage["rows"] if row["key"] == bobs), None)
        # Its hold counted once its end was seen (a round after its pod went).
        return row if row is not None and row["starts"] == 1 and row["reserved_gib_hours"] > 0 else None

    # An open hold grows with every read: two reads a second apart that agree, and it has ended.
    read: list[float] = []

    def ended() -> dict[str, Any] | None:
        row = bobs_row()
        read.append(row["reserved_gib_hours"] if row is not None else -1.0)
        return row if row is not None and len(read) > 1 and read[-1] == read[-2] else None

    row = wait_until(ended, timeout=60, interval=1.0, message="bob's hold accounted and ended")
    held = row["reserved_gib_hours"] * 3600 / 2  # seconds of 2G
    round_ = 2.0  # HOUSEKEEPING_EVERY: a hold's start and end are seen within a round, on load more
    assert deleted - seen_running - 2 * round_ <= held <= gone - posted + 2 * round_, (
        row,
        deleted - seen_running,
    )
    assert row["owner"] == "bob" and row["queue_wait_hours"] * 3600 < 10, row
    # Busy while the cell ran (its start and end as the kernel told them), idle the rest.
    busy, idle = row["busy_hours"] * 3600, row["idle_hours"] * 3600
    assert 3.0 <= busy <= 3.0 + 2.0, row  # the cell's own time, and its round trips
    assert busy + idle == pytest.approx(held, abs=0.5), row

    # Bob sees his own rows only; alice hers (every kernel of the tests above is accounted).
    bob_rows = call(setup, "bob", "GET", "usage?since=1h&by=kernel")[1]
    assert bob_rows["scope"] == "self" and {r["owner"] for r in bob_rows["rows"]} == {"bob"}
    alice_rows = call(setup, "alice", "GET", "usage?since=1h&by=kernel")[1]
    assert {r["owner"] for r in alice_rows["rows"]} == {"alice"} and bobs not in json.dumps(alice_rows)
    assert len(alice_rows["rows"]) >= 2, alice_rows  # her first kernel, and the one that waited
    assert [r["key"] for r in call(setup, "alice", "GET", "usage?since=1h")[1]["rows"]] == ["alice"]
    token = user_token(setup, "bob")
    status, totals = on_broker(setup, token, "GET", "usage/totals")
    assert status == 200 and [r["key"] for r in totals] == ["bob"], totals
    # The command line, as bob (his token, the broker's URL): the same figures.
    done = subprocess.run(
        [str(BIN / "jupyter-gpushare"), "report", "--since", "1h", "--by", "kernel", "--format", "json"],
        env={
            **setup.broker_env,
            "JUPYTER_GPUSHARE_BROKER_URL": setup.broker_url,
            "JUPYTERHUB_API_TOKEN": token,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert {r["key"] for r in json.loads(done.stdout)["rows"]} == {r["key"] for r in bob_rows["rows"]}
    # Its file is the broker's alone.
    path = setup.root / "broker-runtime" / "gpushare-broker-accounting.sqlite"
    assert path.stat().st_mode & 0o777 == 0o600
