"""Kueue (sigs.k8s.io/kueue), built unmodified from its Go module and run against the test
cluster's API server with its own CRDs, webhooks and RBAC from that module.

``python -m tests.cluster.kueue`` prints the controller's path, building it first when missing
(``make kueue`` runs this). kueue/go.mod requires Kueue's module at the version we test and names
its manager command (``cmd/kueue``) as a ``tool``; nothing of Kueue's source is copied or patched,
and the build list is Kueue's own. The binary is kept as ``build/cluster/bin/kueue-<version>-<hash>``,
the hash of kueue/'s module files, so an edit rebuilds and an unchanged tree never does.

What is installed comes from the module's own files in Go's module cache, transformed as its
``config/default`` kustomization does (the ``kueue-`` name prefix, the ``kueue-system``
namespace, the CRD and webhook patches its kustomizations list), with one change a Deployment
behind a Service would not need: the API server reaches the webhook server by URL on loopback
(the controller runs on this machine as a process, not as a pod), trusting the cluster's CA,
which signed the serving certificate (Kueue's internal certificate management is off). The
controller runs as its ServiceAccount (a TokenRequest token) under the module's ClusterRole.

:class:`Kueue` installs and starts it (:meth:`~Kueue.start` waits until its readiness probe
answers and its webhooks serve), and stops it, removing its webhook configurations so that the
cluster's pods do not wait on a webhook that is gone. Its configuration is the module's
``controller_manager_config.yaml`` with: the ``pod`` integration alone (plain pods labelled
``kueue.x-k8s.io/queue-name``) in the namespaces of ``namespaces`` (a label selector), no leader
election (one replica), the probe on a free port, no metrics server, and ``VisibilityOnDemand``
off (its API server binds the fixed port 8082 and reads certificates from /visibility).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from tests.cluster.build import BINARIES, go_environment
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixture import EXAMPLES, SERVER_ACCOUNT, SERVER_NAMESPACE
from tests.cluster.rest import (
    API_SERVICES,
    CLUSTER_QUEUES,
    CUSTOM_RESOURCE_DEFINITIONS,
    ENDPOINT_SLICES,
    ENDPOINTS,
    LOCAL_QUEUES,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    RESOURCE_FLAVORS,
    SERVICES,
    VALIDATING_WEBHOOKS,
    Api,
    ApiError,
    Identity,
    kind_of,
)
from tests.support.servers import free_port

SOURCE = Path(__file__).resolve().parent / "kueue"
MODULE = "sigs.k8s.io/kueue"
PACKAGE = f"{MODULE}/cmd/kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SCHEDULING_GATE = "kueue.x-k8s.io/admission"
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 180.0  # seconds; Kueue starts in seconds, a loaded 2-core machine is slower
# Where Kueue v0.15's manager reads the metrics server's certificate when its internal
# certificate management is off (a fixed path; it exits when the files are missing).
METRICS_CERTIFICATES = Path("kueue/metrics/certs")  # under /etc
# Kueue's visibility API (VisibilityOnDemand: pending workloads and their positions) is an API
# server of its own in the controller, aggregated by the cluster's: it binds this fixed port on
# every address and reads its serving certificate from a fixed directory. The API server reaches
# it at its Service's endpoints, which may not be loopback: an address on a dummy link of its
# own (no traffic leaves the machine). One at a time per machine, under a lock.
VISIBILITY_PORT = 8082
VISIBILITY_CERTIFICATES = Path("/visibility")
VISIBILITY_LINK = "gpushare-kueue0"
VISIBILITY_ADDRESS = "198.19.255.254"
VISIBILITY_LOCK = Path("/tmp/gpushare-kueue-visibility.lock")
IN_CLUSTER_ACCOUNT = Path("/run/secrets/kubernetes.io/serviceaccount")  # /var/run's, in a pod
# The controller's own roles in config/components/rbac (the others are for users of its API).
MANAGER_RBAC = (
    "role.yaml",
    "role_binding.yaml",
    "manager_secrets_role.yaml",
    "manager_secrets_role_binding.yaml",
    "leader_election_role.yaml",
    "leader_election_role_binding.yaml",
    # Its API servers' delegated authentication and authorization (TokenReviews,
    # SubjectAccessReviews): the metrics endpoint's and the visibility API's.
    "metrics_auth_role.yaml",
    "metrics_auth_role_binding.yaml",
)


# -- building ---------------------------------------------------------------------------------------


def version() -> str:
    """The Kueue version kueue/go.mod requires (``v0.15.2``)."""
    found = re.search(r"sigs\.k8s\.io/kueue\s+(v\S+)", (SOURCE / "go.mod").read_text())
    if found is None:
        raise RuntimeError("tests/cluster/kueue/go.mod requires no sigs.k8s.io/kueue version")
    return found.group(1)


def _digest() -> str:
    sha = hashlib.sha256()
    for path in (SOURCE / "go.mod", SOURCE / "go.sum"):
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:12]


def binary() -> Path:
    return BINARIES / f"kueue-{version()}-{_digest()}"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "Kueue is built with Go (1.25 or newer), which is not on PATH: install Go, then run `make kueue`"
        )
    return go


def build(log: object = sys.stderr) -> Path:
    """The controller for the current module files, built first when missing (cold: minutes)."""
    target = binary()
    if target.exists():
        return target
    go = _go()
    BINARIES.mkdir(parents=True, exist_ok=True)
    print(f"building Kueue {version()} (cold: minutes)…", file=log)
    started = time.monotonic()
    partial = target.with_name(target.name + ".partial")
    # -s -w: no symbol table or DWARF, a third smaller, and linking needs less memory; the
    # version is what Kueue's own Makefile stamps into pkg/version.
    ldflags = f"-s -w -X {MODULE}/pkg/version.GitVersion={version()}"
    command = [go, "build", f"-ldflags={ldflags}", "-o", str(partial), PACKAGE]
    subprocess.run(command, cwd=SOURCE, env=go_environment(), check=True)
    partial.rename(target)
    for stale in BINARIES.glob("kueue-*"):
        if stale != target:
            stale.unlink(missing_ok=True)  # an older build
    print(f"built {target.name} in {time.monotonic() - started:.0f} s", file=log)
    return target


def find() -> Path:
    """The built controller; fails with what to run when it is missing."""
    target = binary()
    if not target.exists():
        raise FileNotFoundError(
            f"Kueue is not built ({target.name} is missing under {target.parent}): run `make kueue`"
            " (a cold build takes minutes)"
        )
    return target


def module_directory() -> Path:
    """Kueue's module in Go's module cache (downloaded when missing: its manifests are there)."""
    answer = subprocess.run(
        [_go(), "mod", "download", "-json", f"{MODULE}@{version()}"],
        cwd=SOURCE,
        env=go_environment(),
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(answer.stdout)["Dir"])


# -- the module's manifests, as config/default makes them --------------------------------------------


def _documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


class Manifests:
    """What Kueue's ``config/default`` installs, read from the module's ``config`` directory:
    the ``kueue-`` prefix and ``kueue-system`` namespace of its kustomization applied by hand
    (no kustomize here), and clients of its webhook server given ``url`` and the CA ``ca``
    instead of its Service."""

    def __init__(self, config: Path) -> None:
        self.config = config
        default = self._kustomization("default")
        self.prefix: str = default["namePrefix"]
        self.namespace: str = default["namespace"]

    def _kustomization(self, component: str) -> dict[str, Any]:
        found: dict[str, Any] = yaml.safe_load((self.config / component / "kustomization.yaml").read_text())
        return found

    def _named(self, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` as config/default names it: the prefix, and the namespace of a namespaced one."""
        document = copy.deepcopy(document)
        metadata = document["metadata"]
        metadata["name"] = self.prefix + metadata["name"]
        if "namespace" in metadata:
            metadata["namespace"] = self.namespace
        return document

    def service_account(self) -> dict[str, Any]:
        (account,) = _documents(self.config / "components/rbac/service_account.yaml")
        return self._named(account)

    def rbac(self) -> list[dict[str, Any]]:
        """The controller's ServiceAccount, its ClusterRole (``role.yaml``) and its Roles in its
        namespace (the Secrets it watches there, leader election), bound to it."""
        documents = [self.service_account()]
        for name in MANAGER_RBAC:
            for document in _documents(self.config / "components/rbac" / name):
                document = self._named(document)
                if "roleRef" in document:
                    document["roleRef"]["name"] = self.prefix + document["roleRef"]["name"]
                for subject in document.get("subjects") or []:
                    subject["name"], subject["namespace"] = self.prefix + subject["name"], self.namespace
                documents.append(document)
        return documents

    def visibility(self, address: str) -> list[dict[str, Any]]:
        """What ``config/components/visibility`` installs — the APIServices, the Service they
        name, and the RoleBinding that lets the controller read the API server's
        ``extension-apiserver-authentication`` (in kube-system) — with the Service's endpoints
        at ``address`` instead of the controller's pods."""
        directory = self.config / "components/visibility"
        documents: list[dict[str, Any]] = []
        for resource in self._kustomization("components/visibility")["resources"]:
            for document in _documents(directory / resource):
                kind = document["kind"]
                if kind == API_SERVICES.kind:
                    service = document["spec"]["service"]
                    service["name"], service["namespace"] = self.prefix + service["name"], self.namespace
                elif kind == SERVICES.kind:
                    document = self._named(document)
                    document["metadata"].setdefault("namespace", self.namespace)
                    document["spec"].pop("selector", None)  # its endpoints are ours
                    name = document["metadata"]["name"]
                    (port,) = document["spec"]["ports"]
                    documents += [document, *_endpoints(name, self.namespace, address, port)]
                    continue
                else:  # the RoleBinding in kube-system, to the API server's own Role
                    for subject in document.get("subjects") or []:
                        subject["name"], subject["namespace"] = self.prefix + subject["name"], self.namespace
                documents.append(document)
        return documents

    def custom_resource_definitions(self, url: str, ca: bytes) -> list[dict[str, Any]]:
        """The CRDs with the conversion webhooks their kustomization patches in (served versions
        other than the stored one are converted by Kueue's ``/convert``)."""
        directory = self.config / "components/crd"
        kustomization = self._kustomization("components/crd")
        definitions = {
            document["metadata"]["name"]: document
            for resource in kustomization["resources"]
            for document in _documents(directory / resource)
        }
        for patch in kustomization.get("patches") or []:
            for document in _documents(directory / patch["path"]):
                conversion = copy.deepcopy(document["spec"]["conversion"])
                webhook = conversion["webhook"]
                webhook["clientConfig"] = _client_config(webhook["clientConfig"], url, ca)
                definitions[document["metadata"]["name"]]["spec"]["conversion"] = conversion
        return list(definitions.values())

    def webhook_configurations(self, url: str, ca: bytes) -> list[dict[str, Any]]:
        """The mutating and validating webhook configurations, with their kustomization's patches
        (the pod webhooks' namespace selectors) merged in by webhook name."""
        directory = self.config / "components/webhook"
        kustomization = self._kustomization("components/webhook")
        configurations = [
            document
            for resource in kustomization["resources"]
            for document in _documents(directory / resource)
            if document["kind"] in (MUTATING_WEBHOOKS.kind, VALIDATING_WEBHOOKS.kind)
        ]
        by_name = {(c["kind"], c["metadata"]["name"]): c for c in configurations}
        for patch in kustomization.get("patches") or []:
            change = yaml.safe_load(patch["patch"])
            target = by_name[(change["kind"], change["metadata"]["name"])]
            webhooks = {webhook["name"]: webhook for webhook in target["webhooks"]}
            for webhook in change.get("webhooks") or []:
                webhooks[webhook["name"]].update(webhook)
        named = []
        for configuration in configurations:
            configuration = self._named(configuration)
            for webhook in configuration["webhooks"]:
                webhook["clientConfig"] = _client_config(webhook["clientConfig"], url, ca)
            named.append(configuration)
        return named

    def configuration(
        self,
        *,
        webhook_port: int,
        certificates: Path,
        probe_port: int,
        namespaces: Mapping[str, Any],
        visibility: bool = False,
    ) -> dict[str, Any]:
        """The module's controller_manager_config.yaml, changed as the module docstring says."""
        (configuration,) = _documents(self.config / "components/manager/controller_manager_config.yaml")
        configuration["namespace"] = self.namespace
        configuration["health"] = {"healthProbeBindAddress": f"{HOST}:{probe_port}"}
        configuration["metrics"] = {"bindAddress": "0"}  # "0": no metrics server
        configuration["webhook"] = {"host": HOST, "port": webhook_port, "certDir": str(certificates)}
        configuration["leaderElection"] = {"leaderElect": False}
        configuration["internalCertManagement"] = {"enable": False}
        configuration["integrations"] = {"frameworks": ["pod"]}
        configuration["managedJobsNamespaceSelector"] = dict(namespaces)
        configuration["featureGates"] = {"VisibilityOnDemand": visibility}
        return configuration


def _endpoints(name: str, namespace: str, address: str, port: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A selector-less Service's endpoints at ``address``: its Endpoints, and the EndpointSlice
    the API server's aggregator reads."""
    target = {"name": port["name"], "port": port["targetPort"], "protocol": port.get("protocol", "TCP")}
    return [
        {
            "apiVersion": ENDPOINTS.api_version,
            "kind": ENDPOINTS.kind,
            "metadata": {"name": name, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": address}], "ports": [target]}],
        },
        {
            "apiVersion": ENDPOINT_SLICES.api_version,
            "kind": ENDPOINT_SLICES.kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "gpushare-tests",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [target],
        },
    ]


def _client_config(service_config: Mapping[str, Any], url: str, ca: bytes) -> dict[str, Any]:
    """A webhook client's config reaching ``url`` (with the Service's path), trusting ``ca``."""
    return {"url": url + service_config["service"].get("path", ""), "caBundle": base64.b64encode(ca).decode()}


# -- running ------------------------------------------------------------------------------------------


# Everything but kube-system and Kueue's own namespace: what Kueue's configuration suggests.
ALL_NAMESPACES: dict[str, Any] = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
    ]
}


def in_namespaces(*names: str) -> dict[str, Any]:
    """A namespace selector for ``names``."""
    return {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(names)}]
    }


class KueueError(RuntimeError):
    """Kueue did not start, or stopped; the message ends with its log's last lines."""


class Kueue:
    """Kueue's controller manager on the cluster ``control_plane`` runs, working in ``directory``
    (its log in ``DIR/kueue.log``), managing plain pods in the namespaces ``namespaces`` selects."""

    def __init__(
        self,
        control_plane: ControlPlane,
        directory: Path,
        *,
        namespaces: Mapping[str, Any] = ALL_NAMESPACES,
        binary: Path | None = None,
        progress: Callable[[str], None] | None = None,
        visibility: bool = False,
    ) -> None:
        self.control_plane = control_plane
        self.directory = directory
        self.namespaces = namespaces
        self.visibility = visibility
        self._visibility_lock: Any = None  # the lock file, held while its visibility API serves
        self._made_certificate_directory = False
        self.binary = binary or find()
        self.progress = progress or (lambda message: print(message, file=sys.stderr))
        self.log = directory / "kueue.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.manifests: Manifests | None = None
        self.probe = ""

    def start(self) -> Kueue:
        if os.geteuid() != 0:
            raise KueueError(
                "Kueue runs in a private mount namespace (its metrics certificate has a fixed path "
                "under /etc), which needs root"
            )
        started = time.monotonic()
        self.progress(f"starting Kueue {version()} ({self.binary.name}) in {self.directory}")
        self.directory.mkdir(parents=True, exist_ok=True)
        manifests = self.manifests = Manifests(module_directory() / "config")
        admin = self.control_plane.admin
        with contextlib.suppress(ApiError):  # there already
            admin.create(NAMESPACES, {"metadata": {"name": manifests.namespace}})
        for manifest in manifests.rbac():
            admin.apply(manifest)
        if self.visibility:
            self._claim_visibility()
            # Its Service and the RoleBinding its API server reads the caller's headers' CA by:
            # before it starts (it exits without them); the APIServices once it serves.
            for manifest in manifests.visibility(VISIBILITY_ADDRESS):
                if manifest["kind"] != API_SERVICES.kind:
                    admin.apply(manifest)

        # One serving certificate for the webhook and the (unserved) metrics endpoint.
        authority = self.control_plane.authority
        etc = self.directory / "etc"
        certificates = self.directory / "certificates"
        pair = authority.serving_certificate(HOST)
        pair.write(certificates, "tls")
        pair.write(etc / METRICS_CERTIFICATES, "tls")
        webhook_port, probe_port = free_port(), free_port()
        url = f"https://{HOST}:{webhook_port}"
        self.probe = f"http://{HOST}:{probe_port}/readyz"

        for definition in manifests.custom_resource_definitions(url, authority.pem):
            admin.apply(definition)
        for definition in manifests.custom_resource_definitions(url, authority.pem):
            name = definition["metadata"]["name"]
            self._wait_until(f"the CRD {name}", functools.partial(_established, admin, name))

        account = manifests.service_account()["metadata"]["name"]
        token = self.control_plane.service_account_token(manifests.namespace, account)
        identity = Identity(self.control_plane.server, self.control_plane.ca, token=token)
        kubeconfig = self.control_plane.kubeconfig(self.directory / "kubeconfig", identity)
        config = self.directory / "config.yaml"
        configuration = manifests.configuration(
            webhook_port=webhook_port,
            certificates=certificates,
            probe_port=probe_port,
            namespaces=self.namespaces,
            visibility=self.visibility,
        )
        config.write_text(yaml.safe_dump(configuration))

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(kubeconfig)}
        if self.visibility:
            visibility = self.directory / "visibility"
            authority.serving_certificate(VISIBILITY_ADDRESS).write(visibility, "tls")
            env["KUEUE_VISIBILITY"] = str(visibility)
            # Its visibility API server authenticates callers as one in a pod: the API server's
            # address in the environment, its ServiceAccount's token and the CA in the fixed
            # directory (bound over a /run of its own).
            account_files = self.directory / "serviceaccount"
            account_files.mkdir(parents=True, exist_ok=True)
            (account_files / "token").write_text(token)
            (account_files / "ca.crt").write_bytes(authority.pem)
            (account_files / "namespace").write_text(manifests.namespace)
            address = urlsplit(self.control_plane.server)
            env["KUEUE_SERVICE_ACCOUNT"] = str(account_files)
            env["KUBERNETES_SERVICE_HOST"] = str(address.hostname)
            env["KUBERNETES_SERVICE_PORT"] = str(address.port)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                _command(self.binary, etc, config),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            self._wait_until("its readiness probe", self._ready)
            # Its webhooks only now: pods made meanwhile would have waited on a server not there.
            for configuration in manifests.webhook_configurations(url, authority.pem):
                admin.apply(configuration)
            self._wait_until("its webhooks, through the API server", lambda: _webhooks_answer(admin))
            if self.visibility:
                for manifest in manifests.visibility(VISIBILITY_ADDRESS):
                    if manifest["kind"] == API_SERVICES.kind:
                        admin.apply(manifest)
                self._wait_until(
                    "its visibility API, through the API server", lambda: _visibility_answers(admin)
                )
        except BaseException:
            self.stop()
            raise
        self.progress(f"Kueue {version()} is up after {time.monotonic() - started:.1f} s")
        return self

    def _ready(self) -> bool:
        return httpx.get(self.probe, timeout=5).status_code == 200

    def _claim_visibility(self) -> None:
        """Take the machine's one visibility API (its lock; waiting for another test run's Kueue
        to stop), its address on a dummy link, and the directory its certificate is read from."""
        lock = VISIBILITY_LOCK.open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.progress(f"waiting for another Kueue's visibility API on this machine ({VISIBILITY_LOCK})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        self._visibility_lock = lock
        subprocess.run(["ip", "link", "delete", VISIBILITY_LINK], capture_output=True, check=False)
        for command in (
            ["ip", "link", "add", VISIBILITY_LINK, "type", "bridge"],
            ["ip", "address", "add", f"{VISIBILITY_ADDRESS}/32", "dev", VISIBILITY_LINK],
            ["ip", "link", "set", VISIBILITY_LINK, "up"],
        ):
            subprocess.run(command, capture_output=True, check=True)
        if not VISIBILITY_CERTIFICATES.exists():
            VISIBILITY_CERTIFICATES.mkdir()  # an empty mount point; its files are bound over it
            self._made_certificate_directory = True

    def _release_visibility(self) -> None:
        if self.manifests is not None:
            admin = self.control_plane.admin
            # An APIService whose server is gone fails every client's discovery of the API.
            for manifest in reversed(self.manifests.visibility(VISIBILITY_ADDRESS)):
                with contextlib.suppress(ApiError, httpx.HTTPError):
                    admin.delete(
                        kind_of(manifest), manifest["metadata"]["name"], manifest["metadata"].get("namespace")
                    )
        subprocess.run(["ip", "link", "delete", VISIBILITY_LINK], capture_output=True, check=False)
        if self._made_certificate_directory:
            with contextlib.suppress(OSError):
                VISIBILITY_CERTIFICATES.rmdir()
            self._made_certificate_directory = False
        lock, self._visibility_lock = self._visibility_lock, None
        if lock is not None:
            lock.close()  # and with it the lock

    def _wait_until(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        said = time.monotonic()
        while True:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise KueueError(f"Kueue exited ({code}) waiting for {what}{self._tail()}")
            with contextlib.suppress(OSError, ApiError, httpx.HTTPError):
                if condition():
                    return
            now = time.monotonic()
            if now > deadline:
                raise KueueError(f"Kueue: {what} not within {STARTUP_TIMEOUT:.0f} s{self._tail()}")
            if now - said > 15:
                self.progress(f"still waiting for Kueue: {what}")
                said = now
            time.sleep(0.2)

    def _tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        last = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"; the last lines of {self.log}:\n" + "\n".join(last)

    def stop(self, timeout: float = 30.0) -> None:
        """Remove its webhook configurations (pods are made without it again), then SIGTERM and,
        after ``timeout`` seconds, SIGKILL. Its CRDs and objects stay."""
        if self.manifests is not None:
            admin = self.control_plane.admin
            for configuration in self.manifests.webhook_configurations("https://unused", b""):
                with contextlib.suppress(ApiError, httpx.HTTPError):
                    admin.delete(kind_of(configuration), configuration["metadata"]["name"])
        process, self.process = self.process, None
        try:
            if process is None or process.poll() is not None:
                return
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        finally:
            if self._visibility_lock is not None:
                self._release_visibility()

    def __enter__(self) -> Kueue:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _command(binary: Path, etc: Path, config: Path) -> list[str]:
    """Kueue in a private mount namespace whose /etc is the machine's with ``etc`` laid over it
    (read-only overlay): its fixed metrics certificate path is ours, the machine's /etc untouched.
    With ``$KUEUE_VISIBILITY`` (its visibility API's certificate), that directory is bound over
    the fixed one it reads, and ``$KUEUE_SERVICE_ACCOUNT`` (its token, the CA) where a pod has
    them, on a /run of its own. It is stopped (SIGTERM) when this process dies."""
    script = (
        'set -e; mount -t overlay kueue-etc -o "lowerdir=$0:/etc" /etc; '
        'if [ -n "$KUEUE_VISIBILITY" ]; then '
        f'mount --bind "$KUEUE_VISIBILITY" {VISIBILITY_CERTIFICATES}; '
        f"mount -t tmpfs kueue-run /run; mkdir -p {IN_CLUSTER_ACCOUNT}; "
        f'mount --bind "$KUEUE_SERVICE_ACCOUNT" {IN_CLUSTER_ACCOUNT}; fi; '
        'exec "$@"'
    )
    return [
        "setpriv",
        "--pdeathsig",
        "TERM",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(etc),
        str(binary),
        f"--config={config}",
    ]


def _visibility_answers(admin: Api) -> bool:
    """The API server serves Kueue's visibility API: its APIServices Available, a list answered."""
    for version in ("v1beta1", "v1beta2"):
        found = admin.get(API_SERVICES, f"{version}.visibility.kueue.x-k8s.io")
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
            return False
    admin.request("GET", "/apis/visibility.kueue.x-k8s.io/v1beta2")  # its discovery, through the API server
    return True


def _established(admin: Api, name: str) -> bool:
    found = admin.get(CUSTOM_RESOURCE_DEFINITIONS, name)
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _webhooks_answer(admin: Api) -> bool:
    """A dry-run ClusterQueue goes through Kueue's mutating and validating webhooks and, stored in
    another version than this one, its conversion webhook."""
    queue = {
        "apiVersion": CLUSTER_QUEUES.api_version,
        "kind": CLUSTER_QUEUES.kind,
        "metadata": {"name": "kueue-startup-probe"},
        "spec": {},
    }
    admin.request("POST", CLUSTER_QUEUES.path(), params={"dryRun": "All"}, json=queue)
    return True


# -- queues --------------------------------------------------------------------------------------------


def broker_grants(namespace: str, name: str = "test-broker-kueue") -> list[dict[str, Any]]:
    """The shipped broker RBAC's Kueue rules for the wait estimate (examples/kubernetes/
    broker-rbac.yaml: ``get localqueues`` in its Role, ``get clusterqueues`` in a ClusterRole of
    its own) granted in ``namespace`` to the Jupyter server's ServiceAccount, which the test
    cluster's broker acts as (under the shipped server Role, which has no such rules)."""
    shipped = [doc for doc in yaml.safe_load_all((EXAMPLES / "broker-rbac.yaml").read_text()) if doc]
    [role] = [doc for doc in shipped if doc["kind"] == "Role"]
    [cluster_role] = [
        doc for doc in shipped if doc["kind"] == "ClusterRole" and doc["metadata"]["name"].endswith("-kueue")
    ]
    rules = [rule for rule in role["rules"] if rule["apiGroups"] == ["kueue.x-k8s.io"]]
    subjects = [{"kind": "ServiceAccount", "name": SERVER_ACCOUNT, "namespace": SERVER_NAMESPACE}]
    rbac = "rbac.authorization.k8s.io/v1"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "name": name}
    return [
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": rules,
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {**ref, "kind": "Role"},
            "subjects": subjects,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": cluster_role["rules"],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {**ref, "kind": "ClusterRole"},
            "subjects": subjects,
        },
    ]


def gpu_queues(
    namespace: str,
    *,
    gpus: int,
    cluster_queue: str = "gpu",
    local_queue: str = "gpu",
    flavor: str = "default-flavor",
    resource: str = "nvidia.com/gpu",
    cohort: str | None = None,
) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue holding ``gpus`` of ``resource`` (and CPU and memory
    without a practical limit, so a pod's requests of those never keep it waiting), and a
    LocalQueue in ``namespace`` pointing at it: what docs/admins/kueue.md shows. In a ``cohort``,
    the ClusterQueue lends what it does not use to the cohort's others and may borrow theirs
    (Kueue's default: no limits), and takes what it lent back by preempting a borrower
    (``reclaimWithinCohort: Any``)."""
    shared: dict[str, Any] = (
        {"cohortName": cohort, "preemption": {"reclaimWithinCohort": "Any"}} if cohort else {}
    )
    return [
        {
            "apiVersion": RESOURCE_FLAVORS.api_version,
            "kind": RESOURCE_FLAVORS.kind,
            "metadata": {"name": flavor},
        },
        {
            "apiVersion": CLUSTER_QUEUES.api_version,
            "kind": CLUSTER_QUEUES.kind,
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                **shared,
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", resource],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "10Ti"},
                                    {"name": resource, "nominalQuota": gpus},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": LOCAL_QUEUES.api_version,
            "kind": LOCAL_QUEUES.kind,
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


def cohort_queues(
    namespace: str, teams: tuple[str, ...] = ("team-a", "team-b"), *, gpus: int = 1, cohort: str = "research"
) -> list[dict[str, Any]]:
    """One ResourceFlavor, and for each of ``teams`` a ClusterQueue holding ``gpus`` of
    ``nvidia.com/gpu`` in ``cohort`` with a LocalQueue of the same name in ``namespace``: each
    team has its own quota and may borrow what the others leave unused until they want it back
    (docs/admins/kueue.md shows these)."""
    made = [
        gpu_queues(namespace, gpus=gpus, cluster_queue=team, local_queue=team, cohort=cohort)
        for team in teams
    ]
    return [made[0][0], *(queue for queues in made for queue in queues[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
