"""``gpushare-provisioner`` for Kubernetes (``c.GPUShare.backend = "kubernetes"``): a pod per kernel.

Kubernetes places the slice, so there is no ledger here: the provisioner asks for the pod the
cluster's GPU sharing layer understands (:mod:`jupyter_gpushare.backends.kubernetes.objects.build`,
the same code as ``jupyter gpushare render-pod``), waits honestly, connects securely and cleans up.
Who creates, looks at and deletes the pod is its :class:`~.pod_keeper.PodKeeper`, chosen from the
settings: the server itself with its own Kubernetes client (:mod:`.cluster_pods`), or the GPU broker
over its socket (:mod:`.pods_from_broker`, ``c.GPUShare.broker_url``); everything below is the same
for both.

Lifecycle (the kernel manager calls these in this order):

* ``pre_launch`` — validate the request (size, mode, cores, per-kernel limit) and have the keeper
  check it and make the pod ready, so a bad request fails before anything exists in the cluster.
* ``launch_kernel`` — the keeper creates the pod (and its Secret: the connection file with the
  HMAC key and the CurveZMQ keys, and the kernel's own-slice token) and waits for it to run,
  reporting phase and events. A pod the scheduler cannot place, an image that cannot be pulled,
  a pod that ends while starting or ``launch_timeout`` fail the start with the cluster's reason,
  and nothing is left behind; a restart into a size the cluster cannot place comes back with
  the previous size.
* ``poll``/``wait`` — from the pod's phase; a pod that ended reports its exit code, and why
  (``OOMKilled``, ``Evicted``…) in the log and in ``ended_reason``.
* ``send_signal``/``kill``/``terminate`` — pods take no signals: an interrupt goes through the
  control channel (``interrupt_mode = "message"`` is set on the kernelspec), kill and terminate
  delete the pod.
* ``cleanup`` — delete pod and Secret (a restart creates new ones).

Interrupts and encryption need nothing from the kernel manager's configuration: the CurveZMQ
keys travel in the connection info this provisioner returns (jupyter_client >= 8.10 loads them
into the manager, whose clients and the server's websockets then encrypt), and the kernel reads
them from its connection file (ipykernel >= 7.4).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import signal
import time
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from traitlets import Any as AnyTrait
from traitlets import Float

from jupyter_gpushare.backends.kubernetes.cluster_pods import ClusterPods
from jupyter_gpushare.backends.kubernetes.objects.manifests import pod_name
from jupyter_gpushare.backends.kubernetes.objects.starting import KernelPodStartError
from jupyter_gpushare.backends.kubernetes.pod_keeper import KernelPod, PodKeeper, PodWatch
from jupyter_gpushare.backends.kubernetes.pod_start import KernelPodError
from jupyter_gpushare.backends.kubernetes.pods_from_broker import BrokerPods
from jupyter_gpushare.backends.kubernetes.slice_requests import pod_slice_request
from jupyter_gpushare.backends.provisioning import REQUEST_TRAITS, SliceProvisioner
from jupyter_gpushare.config import GPUShare, load_settings
from jupyter_gpushare.core.errors import (
    POD_HOLDS_ITS_GPU,
    DoesNotFitError,
    NeedsRestartError,
    NotOfferedError,
)
from jupyter_gpushare.core.slice_request import SliceRequest

NEEDS_RESTART = (
    "a kernel pod's GPU slice is fixed for the pod's life: nothing was changed. Resize with a "
    'restart: {"gpu_memory": ..., "restart": true} (%gpu resize SIZE --restart)'
)


async def open_keeper(settings: GPUShare, watch: PodWatch) -> PodKeeper:
    """The keeper the settings choose: with a broker the server holds no cluster credentials, and
    the broker creates the pods; else the server does, with its own client."""
    if settings.effective_broker_url():
        return BrokerPods.open(settings, watch)
    return await ClusterPods.open(settings, watch)


class KubernetesProvisioner(SliceProvisioner):
    """A kernel in its own pod, asking the cluster's GPU sharing layer for its slice."""

    gpu_memory = AnyTrait(None, help="Slice size (docs/users/sizes.md); None takes GPUShare.default_memory.")
    gpu_mode = AnyTrait(None, help="Sharing mode; None takes GPUShare.default_mode.")
    gpu_cores = AnyTrait(None, help="Percent of SMs, where the mode can limit it.")

    poll_interval = Float(
        0.5, config=True, help="Seconds between reads of a kernel pod while it starts, runs or stops."
    )
    unschedulable_grace = Float(
        10.0,
        config=True,
        help="Seconds a pod the scheduler cannot place may keep waiting before the start fails "
        "with the scheduler's reason (a GPU freed by a pod being deleted, as in a restart, "
        "needs a moment). A cluster autoscaler's scale-up waits for launch_timeout instead.",
    )

    _pods: PodKeeper | None = None  # who makes the pods (made at the first start, kept)
    _settings: GPUShare | None = None
    _launched: bool = False
    _exit_code: int | None = None
    _deleted: bool = False
    _last_read: float = 0.0
    _pod_ip: str | None = None
    _token: str | None = None  # the kernel's own-slice token (kept across restarts)
    _resized: bool = False  # gpu_memory was changed by resize_to; the start arguments are stale
    _size_before_resize: tuple[object] | None = None  # the size to come back to if a resize fails
    _argv: list[str] = []  # noqa: RUF012 (replaced per start, never mutated)
    _generation: int = -1  # how many pods this kernel had before its current one
    _launching: asyncio.Task[dict[str, Any]] | None = None  # the pod's start, while it waits
    _abandoned: bool = False  # a shutdown stopped that start (abandon_launch)

    # ---- identity ------------------------------------------------------------------------------

    @property
    def pod(self) -> str:
        return pod_name(self.kernel_id)

    @property
    def has_process(self) -> bool:
        return self._launched

    @property
    def pods(self) -> PodKeeper:
        assert self._pods is not None, "the kernel pod is not prepared (pre_launch)"
        return self._pods

    async def _open_pods(self, settings: GPUShare) -> PodKeeper:
        if self._pods is None:
            watch = PodWatch(
                self.kernel_id, self.set_state, self.log, self.poll_interval, self.unschedulable_grace
            )
            self._pods = await open_keeper(settings, watch)
        return self._pods

    def _kernel_pod(self, settings: GPUShare) -> KernelPod:
        """The pod this start asks for, from the kernel's traits as they stand."""
        assert self._token is not None, "pre_launch first"
        return KernelPod(
            kernel_id=self.kernel_id,
            request=self._request(settings),
            memory=self.gpu_memory,
            mode=self.gpu_mode,
            cores=self.gpu_cores,
            argv=tuple(self._argv),
            env={str(k): str(v) for k, v in (getattr(self.kernel_spec, "env", None) or {}).items()},
            kernel_name=str(getattr(self.parent, "kernel_name", "") or ""),
            token=self._token,
            generation=self._generation,
        )

    # ---- start ---------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        try:
            return await self._prepare(**kwargs)
        except BaseException as error:
            raise self.failed_start(error) from None

    async def _prepare(self, **kwargs: Any) -> dict[str, Any]:
        settings = self._settings = load_settings(self.config, reconcile=False)
        for name in REQUEST_TRAITS:
            if name in kwargs:
                value = kwargs.pop(name)
                if not (self._resized and name == "gpu_memory"):
                    setattr(self, name, value)
        kwargs.pop("gpushare_path", None)
        self._on_state = kwargs.pop("gpushare_on_state", None)
        checked = self.checked_request(kwargs)  # the pod is asked for from the same traits
        self._request(settings)  # a bad request fails before anything is asked of the cluster
        pods = await self._open_pods(settings)
        self._argv = [*self.kernel_spec.argv, *kwargs.pop("extra_arguments", [])]
        self._generation += 1  # every pod of this kernel gets ports of its own (see kernel_ports)
        if self._token is None:
            self._token = secrets.token_urlsafe(24)
        # Pods take no signals: the kernel manager interrupts through the control channel.
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"] = {}  # the server's environment stays in the server; the pod has its own
        kwargs["cmd"] = self._argv
        # Last: what the keeper holds for the start (a place in the quota) launch_kernel drops.
        await pods.prepare(self._kernel_pod(settings), checked is not None)
        return kwargs

    def _request(self, settings: GPUShare) -> SliceRequest:
        return pod_slice_request(self.gpu_memory, self.gpu_mode, self.gpu_cores, settings)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        try:
            return await self._launch()
        except DoesNotFitError as error:
            if self._size_before_resize is None or self._settings is None:
                raise self.failed_start(error) from None
            # A restart into a new size the cluster cannot place: come back with the size that
            # ran, rather than leave the user without a kernel, and say why.
            wanted, previous = self.gpu_memory, self._size_before_resize[0]
            # It stays "resized": a later restart keeps this size, not the one the start asked for.
            self.gpu_memory, self._size_before_resize = previous, None
            self.resize_failure = f"the resize to {wanted} failed: {error}"
            self.log.warning(
                "Kernel %s: %s; restarting with %s", self.kernel_id, self.resize_failure, previous
            )
            self.set_state(f"resize to {wanted} failed; restarting with the previous size")
            self._generation += 1  # a pod (and claim) of its own: the refused one may linger
            await self.pods.rebuild(self._kernel_pod(self._settings))
            try:
                return await self._launch()
            except BaseException as second:
                raise self.failed_start(second) from None
        except BaseException as error:
            raise self.failed_start(error) from None
        finally:
            self._size_before_resize = None  # the resize is settled, one way or the other

    async def _launch(self) -> KernelConnectionInfo:
        assert self._settings is not None, "pre_launch first"
        # A pod that ended on its own (not deleted by a shutdown or a restart asked for) and is
        # launched again: jupyter_server's restarter brings the kernel back after it died.
        self.restarted_after = self.ended_reason
        self._exit_code, self.ended_reason, self._deleted, self._pod_ip = None, None, False, None
        launching = asyncio.ensure_future(
            self.pods.launch(self._kernel_pod(self._settings), self._settings.launch_timeout)
        )
        self._launching, self._abandoned = launching, False
        try:
            found = await launching
        except asyncio.CancelledError:
            self._launched = False
            if self._abandoned and launching.cancelled():
                # Said as a failed start (an Exception), so that the kernel manager's pending
                # start settles and its shutdown can go on.
                raise KernelPodStartError("the kernel was shut down while its pod waited to start") from None
            raise
        except BaseException:
            self._launched = False
            raise
        finally:
            self._launching = None
        self._launched = True
        self._pod_ip = str(found["ip"])
        if self._generation > 0:
            # Once this start has completed: the server's browsers must find the new pod.
            asyncio.get_running_loop().call_soon(self._tell_new_pod)
        info: KernelConnectionInfo = found  # type: ignore[assignment]
        # Typed str, but the kernel manager compares it with its own key, which is bytes.
        info["key"] = str(info["key"]).encode()  # type: ignore[typeddict-item]
        self.connection_info = info
        return info

    def abandon_launch(self) -> bool:
        """Stop the pod's start in progress — a shutdown asked while a restart's new pod waits
        (for quota under Kueue, for a node, for its image): the start fails at once, its pod is
        withdrawn, and the kernel manager can shut the kernel down. False when no start waits."""
        launching = self._launching
        if launching is None or launching.done():
            return False
        self._abandoned = True
        launching.cancel()
        return True

    def _tell_new_pod(self) -> None:
        told = self.pods.new_pod()
        self.log.info(
            "Kernel %s: back in a new pod; %s browser connection(s) reconnect", self.kernel_id, told
        )

    # ---- the kernel's own slice ------------------------------------------------------------------

    # A pod's GPU is the pod's for its life: what only a new pod could do is refused with one
    # error (NotOfferedError, 409).
    async def give_back(self) -> None:
        raise NotOfferedError(f"kernel {self.kernel_id}: {POD_HOLDS_ITS_GPU}")

    async def suspend(self) -> None:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    async def resume(self) -> None:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    async def resize(self, memory: object, restart: bool, force: bool = False) -> bool:
        """A pod's resources are fixed: the new size takes a new pod, so ``restart`` is needed."""
        await asyncio.to_thread(self.pods.check, memory, self.gpu_mode, None)
        if not restart:
            raise NeedsRestartError(NEEDS_RESTART)
        self.resize_to(memory)
        return True

    def resize_to(self, memory: object) -> None:
        """Use ``memory`` for the kernel's next pod (the caller restarts the kernel). Validated
        here, so a bad size changes nothing. If the cluster cannot place the new size, the
        restart comes back with the previous one (``resize_failure`` says why)."""
        assert self._settings is not None, "the kernel pod is not prepared (pre_launch)"
        previous = self.gpu_memory
        self.gpu_memory = memory
        try:
            self._request(self._settings)
        except BaseException:
            self.gpu_memory = previous
            raise
        self._resized = True
        self._size_before_resize = (previous,)
        self.resize_failure = None

    def token_matches(self, token: str | None) -> bool:
        """Whether ``token`` is the one this kernel's Secret carries."""
        return bool(token and self._token) and hmac.compare_digest(str(token), str(self._token))

    # ---- running -------------------------------------------------------------------------------

    async def poll(self) -> int | None:
        """None while the pod runs; its kernel's exit code once it ended or is gone."""
        if not self._launched:
            return self._exit_code if self._exit_code is not None else 0
        if self._exit_code is not None:
            return self._exit_code
        if time.monotonic() - self._last_read < self.poll_interval:
            return None
        self._last_read = time.monotonic()
        end = await self.pods.look()
        if end is None:
            return None
        if end.code is None:
            return self._pod_gone(end.reason)
        self._ended(end.code, end.reason, end.output)
        return self._exit_code

    def _pod_gone(self, reason: str) -> int | None:
        """The exit code of a kernel whose pod is gone: killed when we deleted it, else ended
        for ``reason``."""
        if self._deleted:
            self._exit_code = -signal.SIGKILL
        else:
            self._ended(1, reason)
        return self._exit_code

    def _ended(self, code: int, reason: str, output: str = "") -> None:
        if self._exit_code is not None:  # concurrent polls: say it once
            return
        self._exit_code = code
        self.ended_reason = reason
        self.set_state(f"ended: {reason}")
        if code != 0:
            self.log.warning("Kernel %s: pod %s ended: %s%s", self.kernel_id, self.pod, reason, output)

    async def wait(self) -> int | None:
        code = 0
        while self._launched:
            polled = await self.poll()
            if polled is not None:
                code = polled
                break
            await asyncio.sleep(self.poll_interval)
        self._launched = False
        return code

    async def send_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            await self._interrupt()
        elif signum == signal.SIGKILL:
            await self.kill()
        elif signum == signal.SIGTERM:
            await self.terminate()
        elif signum != 0:
            self.log.warning(
                "Kernel %s: a pod takes no signal %d; only interrupt, terminate and kill",
                self.kernel_id,
                signum,
            )

    async def _interrupt(self) -> None:
        """An interrupt_request on the control channel (the kernel manager's own way for
        ``interrupt_mode = "message"``, for callers that signal instead)."""
        manager = self.parent
        if manager is None or not self._launched:
            return
        socket_ = manager.connect_control()
        try:
            manager.session.send(socket_, "interrupt_request", {})
        finally:
            socket_.close(linger=1000)

    async def kill(self, restart: bool = False) -> None:
        await self._delete_pod(grace_period_seconds=0)

    async def terminate(self, restart: bool = False) -> None:
        await self._delete_pod(grace_period_seconds=None)

    async def _delete_pod(self, grace_period_seconds: int | None) -> None:
        if self._pods is None:
            return
        self._deleted = True
        await self._pods.delete_pod(grace_period_seconds)
        self._last_read = 0.0

    async def cleanup(self, restart: bool = False) -> None:
        """Delete the pod and its objects; a restart makes new ones from pre_launch."""
        self._launched = False
        if self._pods is not None:
            self._deleted = True
            await self._pods.remove()

    # ---- persistence -----------------------------------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info["gpushare"] = {
            "backend": "kubernetes",
            **(self._pods.describe() if self._pods is not None else {}),
            "pod": self.pod,
            "pod_ip": self._pod_ip,
            "state": self.state,
            "interrupt_mode": "message",
        }
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        gpushare = provisioner_info.get("gpushare") or {}
        self._pod_ip = gpushare.get("pod_ip")
        self.state = gpushare.get("state") or ""
        self._settings = load_settings(self.config, reconcile=False)
        await self._open_pods(self._settings)
        self._launched = True


__all__ = ["KernelPodError", "KubernetesProvisioner"]
