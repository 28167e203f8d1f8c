"""A real node in the test cluster: Kubernetes' own kubelet (``kube-testcluster kubelet``, the
same build and version as the control plane) on Debian's containerd and runc, with CNI bridge
networking on 198.18.0.0/15, registered through the Node authorizer as ``system:node:NAME``.

:class:`RealNode` starts, in its work directory:

* an interface of its own (``jgs-node0``, an empty bridge: this VM's kernel has no dummy
  driver) with the node's address, 198.18.255.1 (the kubelet refuses a loopback node IP; the
  API server reaches the kubelet there: pod logs, exec);
* containerd with a configuration of its own (root, state, socket, runc's root and the CNI
  configuration under the work directory; ``SystemdCgroup = false`` and
  ``restrict_oom_score_adj = true``: root here lacks CAP_SYS_RESOURCE, without it every sandbox
  fails "can't get final child's PID from pipe: EOF"), and the local pause and busybox images
  imported into it (node_images.py);
* CNI: a bridge (``jgs-cni0``, 198.18.0.1) and host-local addresses from 198.18.0.0/24 for the
  pods; and an iptables chain (``JGS-REAL-NODE``, first in FORWARD) that forwards nothing from
  the bridge but to the bridge, and nothing into it: there is no kube-proxy, so a pod dialling a
  Service address (10.96.0.1) or anything off the machine is refused at once (a TCP reset), and
  pods reach only the host (the bridge's address) and each other;
* the kubelet: its client certificate ``system:node:NAME`` in ``system:nodes`` and its serving
  certificate for the node's address, both from the cluster's CA; cgroupfs, ``failCgroupV1:
  false`` (cgroup v1 here), no swap check, no iptables chains of its own, an HTTPS port of its
  own on the node's address (not 10250).

It is ready once the Node is ``Ready`` without the not-ready taint. :meth:`RealNode.stop` deletes
the node's pods (the kubelet stops them: their network, mounts, cgroups), stops the kubelet and
containerd, removes the Node, the chain and the interfaces, and restores every host-wide change
(host_state.py); what it could not restore is :attr:`RealNode.leftovers` and an error.

One real node per machine: the kubelet's root (``/var/lib/kubelet``, where device plugins
register: :data:`DEVICE_PLUGINS`), ``/var/log/containers``, ``/run/netns`` and the sysctls are
the machine's, so a lock (:data:`LOCK`) refuses a second one.

Hooks for what runs beside the kubelet: ``labels`` (the node's own, as a device plugin's GPU
Feature Discovery would set them), :data:`DEVICE_PLUGINS` (a device plugin registers at
``kubelet.sock`` there), :meth:`RealNode.import_image` (an OCI archive into the node's
containerd) and :meth:`RealNode.ctr` (containerd's client on the node's socket).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from .controlplane import ControlPlane
from .host_state import PATHS, Footprint, HostState, alive, restore
from .node_images import LocalImage, busybox_image, pause_image
from .nvidia_runtime import NvidiaRuntime, containerd_options
from .rest import LEASES, NODES, PODS, ApiError

NODE_IP = "198.18.255.1"
POD_SUBNET = "198.18.0.0/24"
BRIDGE_IP = "198.18.0.1"
NODE_LINK = "jgs-node0"  # the interface with NODE_IP
BRIDGE = "jgs-cni0"
CHAIN = "JGS-REAL-NODE"
KUBELET_ROOT = Path("/var/lib/kubelet")  # the kubelet's default: device plugins find it here
DEVICE_PLUGINS = KUBELET_ROOT / "device-plugins"  # where a device plugin registers (kubelet.sock)
LOCK = Path("/run/jupyter-gpushare-real-node.lock")
# containerd's sockets: a Unix socket's path has at most 107 bytes, a test's work directory more.
SOCKETS = Path("/run/jupyter-gpushare-real-node")
NOT_READY = "node.kubernetes.io/not-ready"
READY_TIMEOUT = 180.0  # seconds; under a second on an idle machine, a loaded 2-core one is slower
STOP_TIMEOUT = 90.0
# What the API server authorizes a kubelet's callers by (kubeadm binds the same role).
KUBELET_API_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "kube-apiserver-kubelet-client"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:kubelet-api-admin",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}
    ],
}


class RealNodeError(RuntimeError):
    """The real node did not start, or did not stop cleanly; the message says what and where its logs are."""


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RealNodeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def footprint(workdir: Path) -> Footprint:
    """What a real node working in ``workdir`` changes that other users of the machine do not."""
    return Footprint(
        directories=(str(workdir), *PATHS),
        links=(NODE_LINK, BRIDGE),
        markers=(CHAIN, BRIDGE, NODE_IP, "KUBE-"),
    )


class RealNode:
    """One real node of the cluster ``control_plane`` runs, working in ``workdir``."""

    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        name: str = "real-node",
        *,
        labels: Mapping[str, str] | None = None,
        images: Iterable[LocalImage] = (),
        nvidia_runtime: NvidiaRuntime | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.workdir = workdir
        self.name = name
        self.labels = dict(labels or {})
        self.extra_images = list(images)
        # The container toolkit's stand-in, runc's wrapper for every container: GPU containers
        # get the simulated driver's NVML from it (nvidia_runtime.py).
        self.nvidia_runtime = nvidia_runtime
        self.progress = progress or (lambda message: print(message, file=sys.stderr))
        self.pause = pause_image()
        self.busybox = busybox_image()  # the test image: sh, httpd, wget, dd…
        self.socket = SOCKETS / "containerd.sock"
        self.footprint = footprint(workdir)
        self.leftovers: list[str] = []  # what the last stop could not restore
        self._lock: IO[bytes] | None = None
        self._before: HostState | None = None
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None

    # -- what tests and the lead's pieces use --------------------------------------------------------

    def ctr(self, *args: str) -> str:
        """containerd's client (``ctr``) on this node's containerd, in the CRI's namespace."""
        return _run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args]).stdout

    def import_image(self, archive: Path, base_name: str) -> None:
        """Import an OCI archive (an image layout's ``index.json``, ``oci-layout`` and ``blobs/``
        as a tar) into the node's containerd as ``base_name:<the layout's tag>``, unpacked for
        the CRI's snapshotter: pods name it with ``imagePullPolicy: IfNotPresent`` or ``Never``."""
        self.ctr("images", "import", "--base-name", base_name, str(archive))

    def refused(self) -> int:
        """How many packets from the pods the node's chain has refused (to anywhere but the
        host and the bridge): what proves a pod's attempt to reach off the machine ended here."""
        listing = _run(["iptables", "-w", "-L", CHAIN, "-v", "-x", "-n"]).stdout
        return sum(int(line.split()[0]) for line in listing.splitlines() if "REJECT" in line)

    @property
    def log(self) -> Path:
        return self.workdir / "kubelet.log"

    # -- life ------------------------------------------------------------------------------------------

    def start(self) -> RealNode:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._take_lock()
            self._before = HostState.now(self.footprint)
            self._record(self._before)
            self._network()
            self._start_containerd()
            for image in [self.pause, self.busybox, *self.extra_images]:
                self.import_image(image.archive, image.base)
            self._start_kubelet()
            self._wait_ready()
        except BaseException:
            with contextlib.suppress(RealNodeError):
                self.stop()
            raise
        self.progress(f"the real node {self.name} is Ready after {time.monotonic() - started:.1f} s")
        return self

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_lock(self) -> None:
        """The machine's one real node is ours; a record in the lock file of a node whose run
        was killed before its stop is cleared up first."""
        handle = open(LOCK, "a+b")  # noqa: SIM115 -- held until stop
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RealNodeError(
                f"another real node runs on this machine (it holds {LOCK}): there can be one per "
                "machine, as the kubelet's directories, sysctls and cgroups are the machine's"
            ) from None
        self._lock = handle
        handle.seek(0)
        record = handle.read()
        if record:
            self._recover(json.loads(record))

    def _record(self, before: HostState) -> None:
        """What a later node needs to undo this one if this process dies before its stop."""
        assert self._lock is not None
        self._lock.truncate(0)
        self._lock.write(json.dumps({"workdir": str(self.workdir), "before": before.to_json()}).encode())
        self._lock.flush()

    def _recover(self, record: dict[str, Any]) -> None:
        """Stop what a killed run's node left running (its processes name its work directory)
        and restore the machine as that node found it."""
        workdir = record["workdir"]
        self.progress(f"clearing up after a real node whose run was killed (it worked in {workdir})")
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if entry.name.isdigit() and workdir.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
        self._kill_shims()  # they name the socket, the same for every node
        self._remove_chain()
        for link in (NODE_LINK, BRIDGE):
            _run(["ip", "link", "delete", link], check=False)
        left = restore(HostState.from_json(record["before"]), footprint(Path(workdir)))
        if left:
            raise RealNodeError(f"a killed real node's changes could not all be undone: {'; '.join(left)}")
        assert self._lock is not None
        self._lock.truncate(0)

    def _network(self) -> None:
        # An empty bridge holds the address as a dummy interface would (this VM's kernel has no
        # dummy driver): local, and reaching nothing.
        _run(["ip", "link", "add", NODE_LINK, "type", "bridge"])
        _run(["ip", "address", "add", f"{NODE_IP}/32", "dev", NODE_LINK])
        _run(["ip", "link", "set", NODE_LINK, "up"])
        _run(["iptables", "-w", "-N", CHAIN])
        rules = [
            ["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"],  # pod to pod
            ["-i", BRIDGE, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],  # pod to elsewhere
            ["-i", BRIDGE, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"],
            ["-o", BRIDGE, "-j", "DROP"],  # elsewhere to a pod
        ]
        for rule in rules:
            _run(["iptables", "-w", "-A", CHAIN, *rule])
        _run(["iptables", "-w", "-I", "FORWARD", "1", "-j", CHAIN])
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        network = {
            "cniVersion": "0.4.0",
            "name": "jupyter-gpushare-real-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # nothing is NATed off the machine
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": BRIDGE_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(cni / "ipam"),
                    },
                }
            ],
        }
        (cni / "net.d" / "10-real-node.conflist").write_text(json.dumps(network, indent=2))

    def _containerd_config(self) -> str:
        base = self.workdir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{SOCKETS / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"

[{cri}]
  sandbox_image = "{self.pause.ref}"
  restrict_oom_score_adj = true
  enable_selinux = false
  netns_mounts_under_state_dir = true  # pods' network namespaces in our state dir, not /run/netns

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{base / "runc"}"
{self._runtime_options()}
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{self.workdir / "cni" / "net.d"}"
  max_conf_num = 1
"""

    def _runtime_options(self) -> str:
        if self.nvidia_runtime is None:
            return ""
        return containerd_options(self.nvidia_runtime.install(self.workdir / "containerd" / "nvidia-runtime"))

    def _start_containerd(self) -> None:
        base = self.workdir / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        SOCKETS.mkdir(mode=0o700, exist_ok=True)
        config = base / "config.toml"
        config.write_text(self._containerd_config())
        self._containerd = self._spawn(["containerd", "--config", str(config)], base / "containerd.log")
        self._wait_until(
            "containerd answers on its socket",
            lambda: _run(["ctr", "--address", str(self.socket), "version"], check=False).returncode == 0,
            self._containerd,
            base / "containerd.log",
        )

    def _spawn(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        """``command`` in a session of its own, stopped (SIGTERM) when this process dies."""
        with open(log, "ab") as output:
            return subprocess.Popen(
                ["setpriv", "--pdeathsig", "TERM", "--", *command],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _kubelet_config(self, ca: Path, serving: tuple[Path, Path]) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": _free_port(NODE_IP),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,  # cgroup v1 on this kind of machine; later kubelets may refuse it
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": "",  # no DNS: pods reach no name server, and need none
            "registerNode": True,
            "maxPods": 20,
            "shutdownGracePeriod": "0s",
            "serializeImagePulls": False,
            # A shared test machine's disk is fuller than a node's: evict only when it is full,
            # and never collect the local images (no registry could give them back). In bytes, not
            # percent: a 250 GB disk 99% full still has GBs, and the DiskPressure taint it gave
            # the node at "1%" failed a test with "untolerated taint(s)".
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "256Mi",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "256Mi",
                "imagefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        }

    def _start_kubelet(self) -> None:
        plane = self.control_plane
        plane.admin.apply(KUBELET_API_BINDING)
        identity = plane.certificate_identity(f"system:node:{self.name}", ["system:nodes"], self.name)
        kubeconfig = plane.kubeconfig(self.workdir / "kubelet.kubeconfig", identity)
        serving = plane.authority.serving_certificate(NODE_IP).write(self.workdir / "pki", "kubelet")
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(plane.ca, serving)))
        command = [
            str(plane.binary),
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={NODE_IP}",
            "--v=2",
        ]
        if self.labels:
            command.append(
                "--node-labels=" + ",".join(f"{key}={value}" for key, value in self.labels.items())
            )
        self._kubelet = self._spawn(command, self.log)

    def _ready(self) -> bool:
        node = self.control_plane.admin.get(NODES, self.name)
        if node is None:
            return False
        conditions = {item["type"]: item["status"] for item in node.get("status", {}).get("conditions", [])}
        taints = [taint["key"] for taint in node["spec"].get("taints") or []]
        return conditions.get("Ready") == "True" and NOT_READY not in taints

    def _wait_ready(self) -> None:
        self._wait_until(f"the Node {self.name} is Ready", self._ready, self._kubelet, self.log)

    def _wait_until(
        self, what: str, condition: Callable[[], bool], process: subprocess.Popen[bytes] | None, log: Path
    ) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        said = time.monotonic()
        while not condition():
            if process is not None and process.poll() is not None:
                raise RealNodeError(f"exited ({process.returncode}) before {what}{_tail(log)}")
            now = time.monotonic()
            if now > deadline:
                raise RealNodeError(f"{what}: not within {READY_TIMEOUT:.0f} s{_tail(log)}")
            if now - said > 15:
                self.progress(f"still waiting until {what}")
                said = now
            time.sleep(0.2)

    # -- stop ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything and restore the machine; raises :class:`RealNodeError` naming what
        it could not restore (also in :attr:`leftovers`)."""
        if self._lock is None:
            return
        steps: list[Callable[[], object]] = [
            self._drain,
            lambda: _terminate(self._kubelet, 30),
            self._forget_node,
            lambda: _terminate(self._containerd, 30),
            self._kill_shims,
            self._remove_chain,
            lambda: [_run(["ip", "link", "delete", link], check=False) for link in (NODE_LINK, BRIDGE)],
        ]
        try:
            for step in steps:  # each one, whatever the one before met
                try:
                    step()
                except Exception as error:
                    self.progress(f"stopping the real node {self.name}: {error!r}")
            self._kubelet = self._containerd = None
            self.leftovers = restore(self._before, self.footprint) if self._before else []
        finally:
            # A record that a recovery could not clear stays for the next node to try again.
            if self._before is not None and not self.leftovers:
                self._lock.truncate(0)  # nothing for a later node to undo
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None
        if self.leftovers:
            raise RealNodeError(f"the real node left host-wide state behind: {'; '.join(self.leftovers)}")

    def _drain(self) -> None:
        """Delete the node's pods and wait until the kubelet has stopped them (it removes a
        pod's object once its containers, network and volumes are gone). Without an API server
        there is nobody to ask: the restore stops what runs."""
        if self._kubelet is None or self._kubelet.poll() is not None:
            return
        admin = self.control_plane.admin
        selector = f"spec.nodeName={self.name}"
        try:
            for pod in admin.list(PODS, field_selector=selector):
                metadata = pod["metadata"]
                admin.delete(PODS, metadata["name"], metadata["namespace"], grace=1)
            deadline = time.monotonic() + STOP_TIMEOUT
            while admin.list(PODS, field_selector=selector):
                if time.monotonic() > deadline:
                    self.progress(
                        f"the kubelet did not stop the pods of {self.name} within {STOP_TIMEOUT:.0f} s"
                    )
                    return
                time.sleep(0.2)
        except (ApiError, httpx.HTTPError) as error:
            self.progress(f"draining {self.name}: {error}")

    def _forget_node(self) -> None:
        admin = self.control_plane.admin
        with contextlib.suppress(ApiError, httpx.HTTPError):
            for pod in admin.list(PODS, field_selector=f"spec.nodeName={self.name}"):
                metadata = pod["metadata"]
                admin.delete(PODS, metadata["name"], metadata["namespace"], grace=0)
            admin.delete(LEASES, self.name, "kube-node-lease")
            admin.delete(NODES, self.name)

    def _kill_shims(self) -> None:
        """containerd's shims outlive it (by design: containers survive a restart); ours go,
        and are gone before the restore looks at what still uses /run/containerd."""
        address = str(self.socket).encode()
        killed = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                arguments = (entry / "cmdline").read_bytes().split(b"\0")
                if arguments[0].endswith(b"containerd-shim-runc-v2") and address in arguments:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(entry)
        deadline = time.monotonic() + 10
        while any(alive(entry) for entry in killed) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _remove_chain(self) -> None:
        while _run(["iptables", "-w", "-D", "FORWARD", "-j", CHAIN], check=False).returncode == 0:
            pass
        _run(["iptables", "-w", "-F", CHAIN], check=False)
        _run(["iptables", "-w", "-X", CHAIN], check=False)


def _terminate(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(log: Path, lines: int = 30) -> str:
    if not log.exists():
        return ""
    last = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; the last lines of {log}:\n" + "\n".join(last)
