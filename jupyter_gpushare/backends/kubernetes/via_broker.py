"""``gpushare-provisioner`` for kernel pods started by the GPU broker (Kubernetes with a broker).

With ``c.GPUShare.broker_url`` set on the Kubernetes backend, a server holds no cluster
credentials: it asks the broker for its kernel's pod and gets the connection info back once the
pod runs. Everything about the kernel itself — interrupts through the control channel, restarts
with a new size (and back to the old one when the cluster cannot place the new), the own-slice
token its pod proves itself with, CurveZMQ keys kept across restarts — is as for the pods a
server makes itself (:class:`~.provisioner.KubernetesProvisioner`, which this extends); what
changes is who touches the cluster:

* ``pre_launch`` — the broker checks the request with its limits (nothing is created yet).
* ``launch_kernel`` — ``POST pods``, then ``GET pods/{id}`` until the pod runs: the queue
  position (one FIFO queue for all users), the pod's phase, the scheduler's words, then the
  connection info. A broker that cannot be reached fails the start at once.
* while the kernel lives — ``GET pods/{id}`` answers ``poll`` (from the broker's watch, no API
  request) and tells the broker the pod is still wanted; a background lease does the same for
  callers that do not poll (a console), so the broker never collects a live kernel's pod.
* ``kill``/``terminate``/``cleanup`` — ``DELETE pods/{id}``.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

from jupyter_client.connect import KernelConnectionInfo

from ...config import GPUShare, load_settings
from ...errors import BackendUnavailableError, NeedsRestartError, NoSuchKernelError
from ..provisioning import REQUEST_TRAITS
from ..remote import RemoteBackend, remote_backend
from .provisioner import NEEDS_RESTART, KubernetesProvisioner

LEASE_STOPPED = -1.0


class RemotePodProvisioner(KubernetesProvisioner):
    """A kernel in a pod the broker made for this server."""

    _broker: RemoteBackend | None = None
    _connection: dict[str, Any] | None = None  # the last pod's connection info (keys reused)
    _lease: threading.Event | None = None
    _warned_unreachable: bool = False

    @property
    def broker(self) -> RemoteBackend:
        assert self._broker is not None, "the kernel pod is not prepared (pre_launch)"
        return self._broker

    # ---- start ---------------------------------------------------------------------------------

    async def _prepare(self, **kwargs: Any) -> dict[str, Any]:
        settings = self._settings = load_settings(self.config, reconcile=False)
        for name in REQUEST_TRAITS:
            if name in kwargs:
                value = kwargs.pop(name)
                if not (self._resized and name == "gpu_memory"):
                    setattr(self, name, value)
        kwargs.pop("gpushare_path", None)
        self._on_state = kwargs.pop("gpushare_on_state", None)
        checked = self.checked_request(kwargs)
        self._request(settings)  # a bad request fails before the broker is asked
        broker = self._broker = remote_backend(settings)
        if checked is None:  # a start the server checked is not checked again
            await asyncio.to_thread(
                broker.check, self.gpu_memory, self.gpu_mode, self.gpu_cores, self.kernel_id
            )
        self._argv = [*self.kernel_spec.argv, *kwargs.pop("extra_arguments", [])]
        self._generation += 1
        if self._token is None:
            self._token = secrets.token_urlsafe(24)
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super(KubernetesProvisioner, self).pre_launch(**kwargs)
        kwargs["env"] = {}
        kwargs["cmd"] = self._argv
        return kwargs

    async def _rebuild(self, settings: GPUShare) -> None:
        """The broker builds the pod from the size asked in the next ``POST pods``."""

    async def _launch(self) -> KernelConnectionInfo:
        self._exit_code, self.ended_reason, self._deleted, self._pod_ip = None, None, False, None
        broker = self.broker
        report_base = broker.hooks.report_base() if broker.hooks.report_base is not None else None
        previous = self._connection or {}
        body = {
            "kernel_id": self.kernel_id,
            "gpu_memory": self.gpu_memory,
            "gpu_mode": self.gpu_mode,
            "gpu_cores": self.gpu_cores,
            "argv": self._argv,
            "env": {str(k): str(v) for k, v in (getattr(self.kernel_spec, "env", None) or {}).items()},
            "kernel_name": str(getattr(self.parent, "kernel_name", "") or ""),
            "report_url": f"{report_base}api/gpushare/kernels/{self.kernel_id}/usage"
            if report_base
            else None,
            "token": self._token,
            "generation": self._generation,
            "key": previous.get("key"),
            "curve": [previous["curve_publickey"], previous["curve_secretkey"]]
            if previous.get("curve_publickey")
            else None,
        }
        try:
            view = await asyncio.to_thread(broker.client.call, "POST", "pods", body)
            while view["state"] != "running":
                self.set_state(str(view.get("detail") or view["state"]))
                await asyncio.sleep(self.poll_interval)
                view = await asyncio.to_thread(broker.client.call, "GET", f"pods/{self.kernel_id}")
        except BaseException:
            self._launched = False
            await asyncio.shield(asyncio.to_thread(self._withdraw))
            raise
        self._launched = True
        self.set_state(str(view.get("detail") or "running"))
        info: KernelConnectionInfo = dict(view["connection"])  # type: ignore[assignment]
        self._connection = dict(view["connection"])
        self._pod_ip = str(info["ip"])
        # Typed str, but the kernel manager compares it with its own key, which is bytes.
        info["key"] = str(info["key"]).encode()  # type: ignore[typeddict-item]
        self.connection_info = info
        self._keep_lease(float(view.get("renew_within") or 10.0))
        if self._generation > 0:
            asyncio.get_running_loop().call_soon(self._tell_new_pod)
        return info

    def _withdraw(self) -> None:
        try:
            self.broker.client.call("DELETE", f"pods/{self.kernel_id}", {}, timeout=10)
        except BackendUnavailableError as error:
            self.log.warning("Kernel %s: the broker collects the pod itself: %s", self.kernel_id, error)

    def _tell_new_pod(self) -> None:
        hooks = self.broker.hooks
        told = hooks.on_new_pod(self.kernel_id) if hooks.on_new_pod is not None else None
        self.log.info(
            "Kernel %s: back in a new pod; %s browser connection(s) reconnect", self.kernel_id, told
        )

    def _keep_lease(self, every: float) -> None:
        """Tell the broker, every ``every`` seconds, that this kernel's pod is still wanted."""
        self._stop_lease()
        stop = self._lease = threading.Event()
        broker, route = self.broker, f"pods/{self.kernel_id}"

        def renew() -> None:
            while not stop.wait(every):
                try:
                    broker.client.call("GET", route, timeout=10)
                except NoSuchKernelError:
                    return  # the pod is gone; poll says so
                except Exception:  # an unreachable broker: try again next time
                    continue

        threading.Thread(target=renew, name=f"gpushare-lease-{self.kernel_id}", daemon=True).start()

    def _stop_lease(self) -> None:
        if self._lease is not None:
            self._lease.set()
            self._lease = None

    # ---- the kernel's own slice ------------------------------------------------------------------

    async def resize(self, memory: object, restart: bool, force: bool = False) -> bool:
        await asyncio.to_thread(self.broker.check, memory, self.gpu_mode, None, self.kernel_id)
        if not restart:
            raise NeedsRestartError(NEEDS_RESTART)
        self.resize_to(memory)
        return True

    # ---- running -------------------------------------------------------------------------------

    async def _look_at_pod(self) -> int | None:
        """The pod as the broker sees it: None while it runs (or the broker cannot say)."""
        try:
            view = await asyncio.to_thread(self.broker.client.call, "GET", f"pods/{self.kernel_id}")
        except NoSuchKernelError:
            return self._pod_gone("the kernel pod is gone")
        except BackendUnavailableError as error:
            if not self._warned_unreachable:
                self.log.warning(
                    "Kernel %s: taken as running while the broker is away: %s", self.kernel_id, error
                )
            self._warned_unreachable = True
            return None
        self._warned_unreachable = False
        if view["state"] == "ended":
            self._ended(int(view.get("exit_code") or 1), str(view.get("reason") or "the pod ended"))
            return self._exit_code
        return None

    async def _delete_pod(self, grace_period_seconds: int | None) -> None:
        if self._broker is None:
            return
        self._deleted = True
        route = f"pods/{self.kernel_id}" + (
            f"?grace={grace_period_seconds}" if grace_period_seconds is not None else ""
        )
        try:
            await asyncio.to_thread(self.broker.client.call, "DELETE", route, {})
        except BackendUnavailableError as error:
            self.log.warning("Kernel %s: the broker collects the pod itself: %s", self.kernel_id, error)
        self._last_read = 0.0

    async def cleanup(self, restart: bool = False) -> None:
        self._launched = False
        self._stop_lease()
        if self._broker is not None:
            await asyncio.to_thread(self._withdraw)

    def _delete_objects(self) -> None:
        self._deleted = True
        self._stop_lease()
        self._withdraw()

    # ---- persistence -----------------------------------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super(KubernetesProvisioner, self).get_provisioner_info()
        info["gpushare"] = {
            "backend": "kubernetes",
            "broker": self._broker.client.url if self._broker else None,
            "pod": self.pod,
            "pod_ip": self._pod_ip,
            "state": self.state,
            "interrupt_mode": "message",
        }
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super(KubernetesProvisioner, self).load_provisioner_info(provisioner_info)
        gpushare = provisioner_info.get("gpushare") or {}
        self._pod_ip = gpushare.get("pod_ip")
        self.state = gpushare.get("state") or ""
        self._settings = load_settings(self.config, reconcile=False)
        self._broker = remote_backend(self._settings)
        self._launched = True


__all__ = ["RemotePodProvisioner"]
