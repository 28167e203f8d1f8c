"""The control plane as a process: kube-testcluster (controlplane/, built by build.py) started
in a directory of its own, waited for, and stopped.

:class:`ControlPlane` starts the binary (its log in ``DIR/controlplane.log``), waits — saying
what it waits for, with generous deadlines — until the API server answers ``/readyz``, the
controller manager has made the ``default`` ServiceAccount (pods can be created) and the node
Lease namespace exists, and hands out identities: the administrator's :class:`~.rest.Api`, a
client certificate for any user and groups, a token for any ServiceAccount (TokenRequest), and
a kubeconfig for each. It stops on :meth:`~ControlPlane.stop` (SIGTERM, then SIGKILL); the
binary also stops by itself when the process that started it is gone. :meth:`~ControlPlane.down`
then :meth:`~ControlPlane.start` restart the same cluster (data, certificates, port), and
:meth:`~ControlPlane.freeze` / :meth:`~ControlPlane.thaw` stop and continue it, for the fault tests.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from .build import find
from .pki import Authority
from .rest import NAMESPACES, SERVICE_ACCOUNTS, Api, ApiError, Identity, identity_from_kubeconfig

STARTUP_TIMEOUT = 180.0  # seconds; a cold start on a loaded 2-core machine takes well under one


class ControlPlaneError(RuntimeError):
    """The control plane did not start, or stopped; the message ends with its log's last lines."""


FRONT_PROXY_CLIENT = "front-proxy-client"


class ControlPlane:
    """kube-apiserver, kube-scheduler and kube-controller-manager (one process) in ``directory``."""

    def __init__(
        self,
        directory: Path,
        binary: Path | None = None,
        port: int = 0,
        extra_args: Iterable[str] = (),
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = directory
        self.binary = binary or find()
        self.port = port
        self.extra_args = list(extra_args)
        self.progress = progress or (lambda message: print(message, file=sys.stderr))
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "controlplane.log"
        self.admin_kubeconfig = directory / "admin.kubeconfig"
        self.ca = directory / "pki" / "ca.crt"
        self.server = ""
        self.version = ""  # the API server's /version, once started
        self._authority: Authority | None = None
        self._admin: Api | None = None

    # -- life --------------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.admin_kubeconfig.unlink(missing_ok=True)  # its presence says "up"
        command = [
            str(self.binary),
            f"--dir={self.directory}",
            f"--port={self.port}",
            f"--parent-pid={os.getpid()}",
            *self._aggregation(),
            *self.extra_args,
        ]
        started = time.monotonic()
        self.progress(f"starting the control plane ({self.binary.name}) in {self.directory}")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            self._wait_until("the API server answers /readyz", self._answers)
            admin = self.admin
            self._wait_until(
                "the default ServiceAccount (the controller manager is up)",
                lambda: admin.get(SERVICE_ACCOUNTS, "default", "default") is not None,
            )
            self._wait_until(
                "the node Lease namespace", lambda: admin.get(NAMESPACES, "kube-node-lease") is not None
            )
        except BaseException:
            self.stop()
            raise
        self.version = self.admin.request("GET", "/version")["gitVersion"]
        self.progress(
            f"the control plane (Kubernetes {self.version}) is up at {self.server}"
            f" after {time.monotonic() - started:.1f} s"
        )
        return self

    def _aggregation(self) -> list[str]:
        """The API server's flags for aggregated API servers (Kueue's visibility API): its front
        proxy's client certificate, from a CA of its own, and the headers it tells them who asks
        in; an APIService's Service is reached at its endpoints' addresses (no kube-proxy here)."""
        directory = self.directory / "front-proxy"
        authority = Authority.new("front-proxy-ca")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(authority.pem)
        certificate, key = authority.client_certificate(FRONT_PROXY_CLIENT).write(directory, "client")
        return [
            f"--apiserver-arg=--requestheader-client-ca-file={directory / 'ca.crt'}",
            f"--apiserver-arg=--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--apiserver-arg=--requestheader-username-headers=X-Remote-User",
            "--apiserver-arg=--requestheader-group-headers=X-Remote-Group",
            "--apiserver-arg=--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--apiserver-arg=--proxy-client-cert-file={certificate}",
            f"--apiserver-arg=--proxy-client-key-file={key}",
            "--apiserver-arg=--enable-aggregator-routing=true",
        ]

    def _answers(self) -> bool:
        if not self.admin_kubeconfig.exists():
            return False
        config = yaml.safe_load(self.admin_kubeconfig.read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        try:
            return self.admin.text("/readyz") == "ok"
        except ApiError:
            return False

    def _wait_until(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        said = time.monotonic()
        while True:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise ControlPlaneError(f"the control plane exited ({code}) waiting for {what}{self._tail()}")
            with contextlib.suppress(OSError, ApiError, ValueError, httpx.HTTPError):
                if condition():
                    return
            now = time.monotonic()
            if now > deadline:
                raise ControlPlaneError(f"{what}: not within {STARTUP_TIMEOUT:.0f} s{self._tail()}")
            if now - said > 15:
                self.progress(f"still waiting for {what}")
                said = now
            time.sleep(0.1)

    def _tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        last = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"; the last lines of {self.log}:\n" + "\n".join(last)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the directory stays (a restart with it
        and the same port finds the cluster's data and certificates)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        self._terminate(timeout)

    def down(self, timeout: float = 30.0) -> None:
        """Stop the process as a crash or an upgrade would, keeping what :meth:`start` needs to
        bring the same cluster back: the directory, the port (clients find it where it was) and
        the administrator's client (it reconnects)."""
        if self.server:
            self.port = urlsplit(self.server).port or self.port
        self._terminate(timeout)

    def freeze(self) -> None:
        """SIGSTOP the whole control plane, as a stalled VM or a stuck process is: its port
        still accepts connections (the kernel's backlog), nothing answers."""
        assert self.process is not None, "the control plane is not running"
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`: it goes on where it stopped."""
        assert self.process is not None, "the control plane is not running"
        os.killpg(self.process.pid, signal.SIGCONT)

    def _terminate(self, timeout: float) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # frozen by a test that failed: let it stop
            os.killpg(process.pid, signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- identities --------------------------------------------------------------------------------

    @property
    def authority(self) -> Authority:
        if self._authority is None:
            self._authority = Authority.load(self.directory / "pki")
        return self._authority

    def certificate_identity(
        self, user: str, groups: Iterable[str] = (), name: str | None = None
    ) -> Identity:
        """An :class:`~.rest.Identity` with a fresh client certificate for ``user`` in ``groups``
        (files under DIR/identities, named ``name`` or after the user)."""
        pair = self.authority.client_certificate(user, tuple(groups))
        certificate, key = pair.write(self.directory / "identities", safe(name or user))
        return Identity(self.server, self.ca, certificate, key)

    @property
    def admin_identity(self) -> Identity:
        """The administrator (``system:masters``): the client certificate of admin.kubeconfig."""
        return identity_from_kubeconfig(self.admin_kubeconfig, self.directory / "identities" / "admin")

    @property
    def admin(self) -> Api:
        if self._admin is None:
            self._admin = Api(self.admin_identity)
        return self._admin

    def service_account_token(self, namespace: str, name: str, seconds: int = 24 * 3600) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API (the
        ServiceAccount is made when missing)."""
        admin = self.admin
        if admin.get(SERVICE_ACCOUNTS, name, namespace) is None:
            with contextlib.suppress(ApiError):  # made meanwhile
                admin.create(
                    SERVICE_ACCOUNTS, {"metadata": {"name": name, "namespace": namespace}}, namespace
                )
        answer = admin.request(
            "POST",
            SERVICE_ACCOUNTS.path(namespace, name, "token"),
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        token: str = answer["status"]["token"]
        return token

    def kubeconfig(self, path: Path, identity: Identity, namespace: str | None = None) -> Path:
        """A self-contained kubeconfig for ``identity`` (context namespace ``namespace``)."""
        user: dict[str, Any] = {}
        if identity.token:
            user["token"] = identity.token
        if identity.certificate is not None and identity.key is not None:
            user["client-certificate-data"] = base64.b64encode(identity.certificate.read_bytes()).decode()
            user["client-key-data"] = base64.b64encode(identity.key.read_bytes()).decode()
        context: dict[str, Any] = {"cluster": "kube-testcluster", "user": "user"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kube-testcluster",
                    "cluster": {
                        "server": identity.server,
                        "certificate-authority-data": base64.b64encode(identity.ca.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "kube-testcluster", "context": context}],
            "current-context": "kube-testcluster",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path


def safe(name: str) -> str:
    """A user or ServiceAccount name as a file name."""
    return "".join(char if char.isalnum() or char in "-_." else "_" for char in name)
