"""The GPU broker on Kubernetes: what it costs the API server, how fast it admits, what it holds.

Method
------
The test cluster (``tests/cluster/``: Kubernetes' own kube-apiserver, kube-scheduler and
kube-controller-manager, built by ``make controlplane``, and four simulated HAMi GPU nodes that
run the pods the real scheduler binds as local processes) is started by this script. The API
server writes an audit log of every request the Jupyter server's ServiceAccount makes (the
identity the broker and the embedded servers act as, under the shipped RBAC); requests are
counted from it by verb (watch, list, get, create, delete…) and resource. The broker is a real
``jupyter gpushare broker --backend kubernetes`` process (on a Unix socket, so no hub is needed
to identify callers; over HTTP the hub's token check is cached and adds no API request).

1. **Watch connections.** Baseline: K processes each holding what an embedded single-user server
   holds (a ``KubernetesBackend`` with its server attached: it lists and watches nodes and kernel
   pods) — watch connections opened per server, times 200. Broker: the broker process, then 200
   simulated single-user servers (threads in this process) that each ask the broker for the pool
   and their kernels once per second for a window, as servers with the panel open do; watch
   connections the API server saw from start to end, and the broker calls' p50/p99.
2. **API requests per kernel start.** N kernel pod starts through the broker (``POST pods``, then
   ``GET pods/{id}`` until running, as the provisioner does; the pod runs ``sleep``); every non-watch
   API request during the starts, divided by N. Goal: <= 4.
3. **Admission under 20 concurrent starts.** 20 starts posted at the same instant; the time from
   ``POST pods`` until the broker reports the pod created (``starting`` past ``creating the kernel
   pod``, or ``running``), p50/p99.
   Baseline in the same run: 20 concurrent direct creations of the same Secret and pod with the API
   client (what an embedded server does), p50/p99 of their duration.
4. **Memory per 1,000 kernels.** The broker's RSS, then 1,000 kernel pods (for a scheduler the
   cluster does not run, so they stay pending) added to the cluster; once the broker's watch
   shows them and it has answered ``GET kernels`` and ``GET pool`` for them, its RSS again.
   Reported as MiB per 1,000 kernels and as a ratio of the broker's own RSS.

Run: ``.venv/bin/python benchmarks/broker_cluster.py`` (needs the ``test`` and ``cluster`` extras
and the control plane binary: ``make controlplane``); ``--quick`` uses fewer embedded baseline
processes, a shorter window and fewer starts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pwd
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from jupyter_gpushare.backends.broker_client.transport import BrokerClient  # noqa: E402
from jupyter_gpushare.backends.kubernetes.pods_from_broker import LONG_ASK  # noqa: E402
from tests.cluster import PODS, ControlPlane, KubeCluster, Namespace, hami_nodes  # noqa: E402
from tests.cluster.broker import start_broker  # noqa: E402
from tests.cluster.fixture import SERVER_ACCOUNT, SERVER_NAMESPACE  # noqa: E402

BIN = Path(sys.executable).parent
NAMESPACE = "kernels"
IMAGE = "jupyter-gpushare-kernel:bench"
SERVERS = 200
GOAL_REQUESTS_PER_START = 4
KERNEL_PODS = "app.kubernetes.io/name=jupyter-gpushare-kernel"  # every kernel pod's label
CREATING = "creating the kernel pod"  # the broker's detail for an admitted start not yet created
SERVER_USER = f"system:serviceaccount:{SERVER_NAMESPACE}:{SERVER_ACCOUNT}"
# Only the Jupyter server's identity is audited (the broker's and the embedded servers'): the
# scheduler, controllers and nodes talk to the API server too, and are not what is measured.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["{SERVER_USER}"]
  - level: None
"""


class AuditCounts:
    """Requests of the Jupyter server's identity, by (verb, resource), from the API server's
    audit log since the last :meth:`clear`: a watch counts when it starts, others when done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def clear(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def counts(self) -> collections.Counter[tuple[str, str]]:
        time.sleep(0.5)  # the last requests' events reach the log
        counted: collections.Counter[tuple[str, str]] = collections.Counter()
        if not self.path.exists():
            return counted
        with self.path.open("rb") as log:
            log.seek(self.offset)
            for line in log:
                event = json.loads(line)
                verb = event["verb"]
                wanted = "ResponseStarted" if verb == "watch" else "ResponseComplete"
                if event["stage"] != wanted or event["user"]["username"] != SERVER_USER:
                    continue
                reference = event.get("objectRef") or {}
                resource = "/".join(filter(None, (reference.get("resource"), reference.get("subresource"))))
                counted[(verb, resource or event["requestURI"])] += 1
        return counted

    def watches(self) -> int:
        return sum(n for (verb, _), n in self.counts().items() if verb == "watch")

    def requests(self) -> int:
        return sum(n for (verb, _), n in self.counts().items() if verb != "watch")


# The pending pods' owner: the benchmark's OS user, whom the broker's Unix socket identifies (a
# caller sees its own kernels).
OWNER = pwd.getpwuid(os.getuid()).pw_name


def bench_id(name: str) -> str:
    """A kernel id (the broker takes UUIDs only) that the benchmark can name again."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"jupyter-gpushare-bench/{name}"))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


EMBEDDED = """
import sys, time
from jupyter_gpushare.backends.protocol import ServerHooks
from jupyter_gpushare.backends.kubernetes import KubernetesBackend
from jupyter_gpushare.config import GPUShare
backend = KubernetesBackend(GPUShare(backend="kubernetes", namespace="kernels", owner=sys.argv[1],
                                     resource_preset="hami"))
backend.attach_server(ServerHooks())
backend.pool()
print("ready", flush=True)
time.sleep(600)
"""


def embedded_watches(audit: AuditCounts, env: dict[str, str], processes: int) -> float:
    """Watch connections one embedded server opens (measured over ``processes`` of them)."""
    audit.clear()
    started = [
        subprocess.Popen(
            [sys.executable, "-c", EMBEDDED, f"user{index}"], env=env, stdout=subprocess.PIPE, text=True
        )
        for index in range(processes)
    ]
    try:
        for process in started:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        return audit.watches() / processes
    finally:
        for process in started:
            process.kill()
            process.wait()


def servers_polling(url: str, servers: int, window: float, follow: bool) -> tuple[list[float], int]:
    """``servers`` single-user servers asking for the pool, the marker and their kernels once a
    second, as a server's panel stream does: ``RemoteBackend`` objects, each following the
    broker's event stream when ``follow`` (as servers do), else asking the broker every time.
    The seconds each round took, and the broker requests they made in all."""
    from jupyter_gpushare.backends.broker_client.backend import RemoteBackend
    from jupyter_gpushare.backends.protocol import ServerHooks, ServerKernels
    from jupyter_gpushare.config import GPUShare

    made = [0]
    original = BrokerClient.call

    def counted(self: BrokerClient, *args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return original(self, *args, **kwargs)

    backends = [RemoteBackend(GPUShare(broker_url=url, reconcile_on_start=False)) for _ in range(servers)]
    if follow:
        for backend in backends:
            backend.attach_server(ServerHooks())
        deadline = time.monotonic() + 30
        while not all(backend.feed is not None and backend.feed.latest() for backend in backends):
            assert time.monotonic() < deadline, "the feeds did not come up"
            time.sleep(0.05)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + window
    BrokerClient.call = counted  # type: ignore[method-assign]

    def server(index: int, backend: RemoteBackend) -> None:
        known = ServerKernels()
        time.sleep(index / servers)  # spread over the second, as independent servers are
        while time.monotonic() < stop:
            began = time.perf_counter()
            backend.change_marker()
            backend.pool()
            backend.kernels(known)
            with lock:
                latencies.append(time.perf_counter() - began)
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))

    threads = [
        threading.Thread(target=server, args=(index, backend)) for index, backend in enumerate(backends)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        BrokerClient.call = original  # type: ignore[method-assign]
        for backend in backends:
            if backend.feed is not None:
                backend.feed.stop()
    return latencies, made[0]


# A start that has not run after this long is stuck, not slow: the run fails with its state.
START_DEADLINE = 600.0


def start_pods(client: BrokerClient, count: int, tag: str) -> tuple[list[float], list[float], float, float]:
    """``count`` kernel pod starts posted at once (each then asking the broker how it stands
    until it runs, with long asks as the provisioner does: answered when the start moves on):
    seconds to admitted and to running for each, the seconds from the first start posted to
    the last pod running, and the CPU seconds the callers' threads spent."""
    barrier = threading.Barrier(count)
    admitted: list[float] = []
    running: list[float] = []
    posted: list[float] = []
    finished: list[float] = []
    cpu: list[float] = []

    def start(index: int) -> None:
        own = BrokerClient(client.url)
        kernel_id = bench_id(f"{tag}-{index}")
        body = {
            "kernel_id": kernel_id,
            "gpu_memory": "1G",
            "gpu_mode": "vgpu",
            "argv": ["sleep", "600"],
            "token": "t" * 32,
            "kernel_name": "bench",
        }
        barrier.wait()
        cpu_began = time.thread_time()
        began = time.perf_counter()
        posted.append(began)
        view = own.call("POST", "pods", body)
        seen_admitted = False
        deadline = began + START_DEADLINE
        while view["state"] != "running":
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{kernel_id} not running after {START_DEADLINE:g} s: {view}")
            # Created: past "starting" with the detail "creating the kernel pod" (an admitted
            # start whose Secret and pod requests are still going out).
            if not seen_admitted and view["state"] == "starting" and view.get("detail") != CREATING:
                admitted.append(time.perf_counter() - began)
                seen_admitted = True
            ask = f"pods/{kernel_id}?wait={LONG_ASK:g}&seen={view['mark']}"
            view = own.call("GET", ask, timeout=LONG_ASK + 20)
        if not seen_admitted:
            admitted.append(time.perf_counter() - began)
        running.append(time.perf_counter() - began)
        finished.append(time.perf_counter())
        cpu.append(time.thread_time() - cpu_began)

    threads = [threading.Thread(target=start, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(finished) < count:
        raise RuntimeError(f"{count - len(finished)} of {count} starts through the broker failed (see above)")
    return admitted, running, max(finished) - min(posted), sum(cpu)


def plain_starts(
    kubeconfig: str, count: int, tag: str, *, until_running: bool = True
) -> tuple[list[float], list[float], float, float]:
    """The baseline: ``count`` concurrent starts by a plain client of the Kubernetes API, what an
    embedded server does without a broker. One thread per start builds the start's Secret and
    pod as the broker builds them (fresh keys included) and creates them, both timed as the
    broker's are, with the Kubernetes package's client, its connection pool
    sized as the broker's (:class:`Cluster`); with ``until_running``, the default scheduler places
    the pods and one list+watch of them (no per-pod reads) tells each thread when its pod runs;
    without, the pods are for a scheduler the cluster does not run and stay pending.

    Returns the seconds each start took to build and create its two objects ("admitted") and to see its
    pod running (without ``until_running``: the same), the seconds from the first start to the
    last pod running, and the CPU seconds the client's threads spent. The pods and Secrets are
    left in place: :func:`delete_plain` removes them."""
    os.environ["KUBECONFIG"] = kubeconfig
    from kubernetes import watch as k8s_watch

    from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, load_configuration
    from jupyter_gpushare.backends.kubernetes.objects.build import cluster_facts, kernel_pod
    from jupyter_gpushare.backends.kubernetes.objects.manifests import (
        connection_info,
        kernel_ports,
        make_secret,
        pod_name,
    )
    from jupyter_gpushare.config import GPUShare
    from jupyter_gpushare.core.slice_request import make_slice_request

    settings = GPUShare(
        backend="kubernetes",
        resource_preset="hami",
        kernel_image=IMAGE,
        **({} if until_running else {"scheduler_name": "elsewhere"}),
    )
    cluster = Cluster(NAMESPACE, configuration=load_configuration().configuration)
    barrier = threading.Barrier(count + (1 if until_running else 0))
    kernel_ids = [plain_kernel_id(tag, index) for index in range(count)]
    names = [pod_name(kernel_id) for kernel_id in kernel_ids]
    running_at = {name: threading.Event() for name in names}
    admitted: list[float] = []
    running: list[float] = []
    posted: list[float] = []
    finished: list[float] = []
    cpu: list[float] = []
    lock = threading.Lock()

    def follow() -> None:
        """One list+watch of the kernel pods, until every one of ours runs. The API server ends
        a watch whose reader falls behind a burst (both sides' watches, at 200 starts, within
        seconds): then list and watch again, as an informer does, from the list on."""
        began = time.thread_time()
        waiting = set(names)
        deadline = time.monotonic() + START_DEADLINE

        def seen(pod: dict[str, Any]) -> None:
            name = pod["metadata"]["name"]
            if name in waiting and (pod.get("status") or {}).get("phase") == "Running":
                waiting.discard(name)
                running_at[name].set()

        barrier.wait()
        try:
            while waiting and time.monotonic() < deadline:
                response: Any = cluster.core.list_namespaced_pod(
                    NAMESPACE, label_selector=KERNEL_PODS, _preload_content=False
                )
                listing = json.loads(response.data)
                for pod in listing["items"]:
                    seen(pod)
                watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
                for event in watcher.stream(  # type: ignore[no-untyped-call]
                    cluster.core.list_namespaced_pod,
                    NAMESPACE,
                    label_selector=KERNEL_PODS,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=int(max(1, deadline - time.monotonic())),
                    deserialize=False,  # JSON only: a reader that keeps up with the burst
                ):
                    if event["type"] == "ERROR":
                        break  # 410 Gone: list again
                    seen(event["object"])
                    if not waiting:
                        watcher.stop()  # type: ignore[no-untyped-call]
                        break
        finally:
            with lock:
                cpu.append(time.thread_time() - began)

    def start(index: int) -> None:
        kernel_id = kernel_ids[index]
        # Timed from here: a start builds its objects (the pod, the Secret with fresh keys), as an
        # embedded server does and as the broker does for every POST it times, then creates them.
        barrier.wait()
        cpu_began = time.thread_time()
        began = time.perf_counter()
        request = make_slice_request("1G", "vgpu", None, "4G", "vgpu")
        pod, _ = kernel_pod(
            settings,
            kernel_id=kernel_id,
            server_id="bench@plain",
            owner="bench",
            request=request,
            cluster=cluster_facts(settings),
            argv=["sleep", "600"],
            namespace=NAMESPACE,
        )
        secret = make_secret(
            kernel_id,
            "bench@plain",
            "bench",
            NAMESPACE,
            connection_info(kernel_ports(), secrets.token_hex(32), "bench"),
            "t" * 32,
        )
        cluster.create_secret(secret)
        cluster.create_pod(pod)
        created = time.perf_counter() - began
        if until_running and not running_at[names[index]].wait(START_DEADLINE):
            raise RuntimeError(f"{names[index]} not running after {START_DEADLINE:g} s")
        with lock:
            posted.append(began)
            admitted.append(created)
            running.append(time.perf_counter() - began)
            finished.append(time.perf_counter())
            cpu.append(time.thread_time() - cpu_began)

    threads = [threading.Thread(target=start, args=(index,)) for index in range(count)]
    if until_running:
        threads.append(threading.Thread(target=follow))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cluster.close()
    if len(admitted) < count:
        raise RuntimeError(f"{count - len(admitted)} of {count} plain starts failed (see above)")
    return admitted, running, max(finished) - min(posted), sum(cpu)


def plain_kernel_id(tag: str, index: int) -> str:
    return f"plain-{tag}-{index:04d}"


def delete_plain(kubeconfig: str, count: int, tag: str) -> None:
    """Delete what :func:`plain_starts` made (at once: grace 0)."""
    os.environ["KUBECONFIG"] = kubeconfig
    from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, load_configuration
    from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name, secret_name

    cluster = Cluster(NAMESPACE, configuration=load_configuration().configuration)
    for index in range(count):
        kernel_id = plain_kernel_id(tag, index)
        cluster.delete_pod(pod_name(kernel_id), grace_period_seconds=0)
        cluster.delete_secret(secret_name(kernel_id))
    cluster.close()


def pending_pod(index: int) -> dict[str, Any]:
    kernel_id = bench_id(f"idle-{index}")
    return {
        "metadata": {
            "name": f"gpushare-kernel-{kernel_id}",
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "jupyter-gpushare-kernel",
                "jupyter-gpushare.io/owner": OWNER,
            },
            "annotations": {"jupyter-gpushare.io/size": "1G"},
        },
        "spec": {
            "schedulerName": "elsewhere",
            "containers": [
                {
                    "name": "kernel",
                    "image": IMAGE,
                    "env": [
                        {"name": "JUPYTER_GPUSHARE_KERNEL_ID", "value": kernel_id},
                        {"name": "JUPYTER_GPUSHARE_OWNER", "value": OWNER},
                        {"name": "JUPYTER_GPUSHARE_MODE", "value": "vgpu"},
                        {"name": "JUPYTER_GPUSHARE_MEMORY_BYTES", "value": str(1 << 30)},
                    ],
                }
            ],
        },
    }


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def add_pending_pods(
    cluster: KubeCluster, client: BrokerClient, count: int, expected: int
) -> tuple[list[Any], float]:
    """Add ``count`` pending kernel pods; once the broker shows ``expected`` kernels, its
    ``GET kernels`` answer and the seconds ``GET pool`` + ``GET kernels`` took."""
    for index in range(count):
        cluster.add(PODS, pending_pod(index))
    deadline = time.monotonic() + 300
    while (shown := len(client.call("GET", "kernels"))) < expected:
        assert time.monotonic() < deadline, f"the broker's watch shows {shown} of {expected} kernels"
        time.sleep(0.5)
    began = time.perf_counter()
    client.call("GET", "pool")
    listing: list[Any] = client.call("GET", "kernels")
    return listing, time.perf_counter() - began


def audited_plane(root: Path) -> tuple[ControlPlane, AuditCounts]:
    """The test cluster's control plane in ``root``, auditing the Jupyter server's identity."""
    (root / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = AuditCounts(root / "audit.log")
    plane = ControlPlane(
        root / "controlplane",
        extra_args=[
            f"--apiserver-arg=--audit-policy-file={root / 'audit-policy.yaml'}",
            f"--apiserver-arg=--audit-log-path={audit.path}",
        ],
    )
    return plane, audit


def broker_env(root: Path, kubeconfig: Path) -> dict[str, str]:
    """The environment of a broker (or an embedded server) on the test cluster, HAMi preset."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")},
        "KUBECONFIG": str(kubeconfig),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_GPUSHARE_RESOURCE_PRESET": "hami",
        "JUPYTER_GPUSHARE_KERNEL_IMAGE": IMAGE,
        "JUPYTER_GPUSHARE_NAMESPACE": NAMESPACE,
        "JUPYTER_GPUSHARE_ENCRYPT": "False",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--servers", type=int, default=SERVERS)
    arguments = parser.parse_args()
    embedded_processes = 3 if arguments.quick else 8
    window = 4.0 if arguments.quick else 10.0
    starts = 10 if arguments.quick else 40
    idle_pods = 1000

    with tempfile.TemporaryDirectory(prefix="gpushare-broker-cluster-") as directory:
        root = Path(directory)
        plane, audit = audited_plane(root)
        with (
            plane,
            KubeCluster(
                plane, Namespace(plane, NAMESPACE).create().name, root / "cluster", hami_nodes(4)
            ) as cluster,
        ):
            env = broker_env(root, cluster.kubeconfig)
            # The simulated servers are threads of one OS user here, where real ones are each
            # their own user: the per-user connection limit is lifted to what they hold (an
            # event stream and a call each).
            (root / "config").mkdir()
            broker_settings = {"GPUShareBroker": {"max_connections_per_user": 4 * arguments.servers}}
            (root / "config" / "jupyter_server_config.json").write_text(json.dumps(broker_settings))
            per_server = embedded_watches(audit, env, embedded_processes)
            audit.clear()
            broker, client = start_broker(root, env)
            try:
                asked, asked_requests = servers_polling(client.url, arguments.servers, window, follow=False)
                followed, followed_requests = servers_polling(
                    client.url, arguments.servers, window, follow=True
                )
                broker_watches = audit.watches()
                rounds = arguments.servers * window
                print(f"1. watch connections to the API server ({arguments.servers} single-user servers)")
                print(
                    f"   embedded: {per_server:.1f} per server (measured on {embedded_processes}) -> "
                    f"{per_server * arguments.servers:.0f} for {arguments.servers}"
                )
                print(f"   broker:   {broker_watches} in all (nodes and kernel pods, one list+watch each)")
                print(f"   ratio broker/embedded: {broker_watches / (per_server * arguments.servers):.4f}")
                servers = arguments.servers
                print(f"   {servers} servers reading pool, marker and kernels each second for {window:g} s:")
                print(
                    f"     asking the broker each time: {asked_requests / rounds:.2f} broker requests per "
                    f"server per second, a round p50 {statistics.median(asked) * 1000:.1f} ms, "
                    f"p99 {percentile(asked, 0.99) * 1000:.1f} ms"
                )
                print(
                    f"     following its stream (as servers do): {followed_requests / rounds:.2f} requests "
                    f"per server per second, a round p50 {statistics.median(followed) * 1000:.2f} ms, "
                    f"p99 {percentile(followed, 0.99) * 1000:.2f} ms"
                )

                audit.clear()
                start_pods(client, starts, "seq")
                counted = audit.counts()
                per_start = sum(n for (verb, _), n in counted.items() if verb != "watch") / starts
                breakdown = {f"{verb} {resource}": n for (verb, resource), n in sorted(counted.items())}
                print(
                    f"2. API requests per kernel start ({starts} starts): {per_start:.2f} "
                    f"(goal <= {GOAL_REQUESTS_PER_START}) {json.dumps(breakdown)}"
                )
                for index in range(starts):
                    client.call("DELETE", f"pods/{bench_id(f'seq-{index}')}?grace=0", {})

                admitted, running, _, _ = start_pods(client, 20, "burst")
                direct, _, _, _ = plain_starts(str(cluster.kubeconfig), 20, "burst", until_running=False)
                delete_plain(str(cluster.kubeconfig), 20, "burst")
                print("3. 20 concurrent starts: admission (POST -> pod created)")
                print(
                    f"   broker: p50 {statistics.median(admitted) * 1000:.0f} ms, "
                    f"p99 {percentile(admitted, 0.99) * 1000:.0f} ms"
                    f" (to running: p50 {statistics.median(running) * 1000:.0f} ms)"
                )
                print(
                    "   direct creation by the API client (baseline): "
                    f"p50 {statistics.median(direct) * 1000:.0f} ms, "
                    f"p99 {percentile(direct, 0.99) * 1000:.0f} ms"
                )
                ratio = percentile(admitted, 0.99) / percentile(direct, 0.99)
                # Its goal is judged where both sides also run their pods: broker_scale.py.
                print(f"   ratio of the p99s: {ratio:.2f} (no goal here: broker_scale.py --against-plain)")
                for index in range(20):
                    client.call("DELETE", f"pods/{bench_id(f'burst-{index}')}?grace=0", {})

                time.sleep(1.0)
                base = rss_mib(broker.pid)
                listing, took = add_pending_pods(cluster, client, idle_pods, idle_pods)
                after = rss_mib(broker.pid)
                print(
                    f"4. broker memory: {base:.0f} MiB with no kernel, {after:.0f} MiB with {len(listing)} "
                    f"kernel pods: {(after - base) * 1000 / idle_pods:.1f} MiB per 1,000 kernels "
                    f"(ratio {after / base:.2f} of its own RSS); "
                    f"GET pool + kernels with them: {took * 1000:.0f} ms"
                )
                verdict = per_start <= GOAL_REQUESTS_PER_START and broker_watches <= 2
                print("verdict:", "goals met" if verdict else "goal MISSED")
            finally:
                broker.terminate()
                broker.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
