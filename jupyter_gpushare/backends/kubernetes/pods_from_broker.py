"""The kernel pods the GPU broker creates for a server: a :class:`~.pod_keeper.PodKeeper`.

With ``c.GPUShare.broker_url`` set on the Kubernetes backend, a server holds no cluster
credentials: it asks the broker for its kernel's pod and gets the connection info back once the
pod runs. The kernel itself — interrupts, restarts with a new size, its own-slice token — is the
pod provisioner's as for the pods a server makes itself; what the broker does:

* ``prepare`` — the broker checks the request with its limits (nothing is created yet).
* ``launch`` — ``POST pods``, then ``GET pods/{id}`` until the pod runs: the queue position (one
  FIFO queue for all users), the pod's phase, the scheduler's words, then the connection info,
  whose keys the next pod of the kernel keeps. Each ask is a long one (``?wait=&seen=``): the
  broker answers when what it says changes, so a start costs a few answers, not one per
  ``poll_interval`` (a broker without long asks answers at once, and is asked every
  ``poll_interval``). A broker that cannot be reached fails the start.
* while the kernel lives — ``GET pods/{id}`` answers ``look`` (from the broker's watch, no API
  request) and tells the broker the pod is still wanted; a background lease does the same for
  callers that do not poll (a console), so the broker never collects a live kernel's pod.
* ``delete_pod``/``remove`` — ``DELETE pods/{id}``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_gpushare.backends.broker_client.backend import RemoteBackend, remote_backend
from jupyter_gpushare.backends.kubernetes.pod_keeper import KernelPod, PodEnd, PodWatch
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import BackendUnavailableError, NoSuchKernelError

# Seconds a starting kernel's ask may wait at the broker for news (the broker answers sooner when
# the start moves on, and holds a start's ask for at most its own LONGEST_ASK).
LONG_ASK = 10.0
# Long asks hold a thread each while they wait: their own, so that a burst of starts in one
# server never fills the event loop's default executor, which every other blocking call shares.
_long_asks = ThreadPoolExecutor(max_workers=64, thread_name_prefix="gpushare-long-ask")


class BrokerPods:
    """Kernel ``watch.kernel_id``'s pods, made by the broker for this server."""

    def __init__(self, broker: RemoteBackend, watch: PodWatch) -> None:
        self.broker = broker
        self.watch = watch
        self.route = f"pods/{watch.kernel_id}"
        self._connection: dict[str, Any] = {}  # the last pod's connection info (keys reused)
        self._lease: threading.Event | None = None
        self._warned_unreachable = False

    @classmethod
    def open(cls, settings: GPUShare, watch: PodWatch) -> BrokerPods:
        return cls(remote_backend(settings), watch)

    # ---- start ---------------------------------------------------------------------------------

    async def prepare(self, pod: KernelPod, checked: bool) -> None:
        if not checked:  # a start the server checked is not checked again
            await asyncio.to_thread(self.check, pod.memory, pod.mode, pod.cores)

    async def rebuild(self, pod: KernelPod) -> None:
        """The broker builds the pod from the size asked in the next ``POST pods``."""

    async def launch(self, pod: KernelPod, timeout: float) -> dict[str, Any]:
        # The broker holds the start to its own launch_timeout and says why it failed.
        hooks, previous = self.broker.hooks, self._connection
        report_base = hooks.report_base() if hooks.report_base is not None else None
        body = {
            "kernel_id": pod.kernel_id,
            "gpu_memory": pod.memory,
            "gpu_mode": pod.mode,
            "gpu_cores": pod.cores,
            "argv": list(pod.argv),
            "env": {str(k): str(v) for k, v in pod.env.items()},
            "kernel_name": pod.kernel_name,
            "report_url": f"{report_base}api/gpushare/kernels/{pod.kernel_id}/usage" if report_base else None,
            "token": pod.token,
            "generation": pod.generation,
            "key": previous.get("key"),
            "curve": [previous["curve_publickey"], previous["curve_secretkey"]]
            if previous.get("curve_publickey")
            else None,
        }
        call = self.broker.client.call
        try:
            view = await asyncio.to_thread(call, "POST", "pods", body)
            while view["state"] != "running":
                self.watch.say(str(view.get("detail") or view["state"]))
                view = await self._ask_after(view)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._withdraw))
            raise
        self.watch.say(str(view.get("detail") or "running"))
        self._connection = dict(view["connection"])
        self._keep_lease(float(view.get("renew_within") or 10.0))
        return dict(view["connection"])

    async def _ask_after(self, last: dict[str, Any]) -> dict[str, Any]:
        """The start's next answer: a long ask, answered when ``last`` no longer holds."""
        asked = time.monotonic()
        query = urllib.parse.urlencode({"wait": f"{LONG_ASK:g}", "seen": str(last.get("mark") or "")})
        call = self.broker.client.call
        loop = asyncio.get_running_loop()
        view: dict[str, Any] = await loop.run_in_executor(
            _long_asks, lambda: call("GET", f"{self.route}?{query}", timeout=LONG_ASK + 20)
        )
        if "mark" not in view:  # a broker without long asks: it answered at once
            await asyncio.sleep(max(0.0, self.watch.poll_interval - (time.monotonic() - asked)))
        return view

    def _withdraw(self) -> None:
        try:
            self.broker.client.call("DELETE", self.route, {}, timeout=10)
        except BackendUnavailableError as error:
            self._collects_itself(error)

    def _collects_itself(self, error: BackendUnavailableError) -> None:
        self.watch.log.warning(
            "Kernel %s: the broker collects the pod itself: %s", self.watch.kernel_id, error
        )

    def _keep_lease(self, every: float) -> None:
        """Tell the broker, every ``every`` seconds, that this kernel's pod is still wanted."""
        self._stop_lease()
        stop = self._lease = threading.Event()
        call, route = self.broker.client.call, self.route

        def renew() -> None:
            while not stop.wait(every):
                try:
                    call("GET", route, timeout=10)
                except NoSuchKernelError:
                    return  # the pod is gone; poll says so
                except Exception:  # an unreachable broker: try again next time
                    continue

        name = f"gpushare-lease-{self.watch.kernel_id}"
        threading.Thread(target=renew, name=name, daemon=True).start()

    def _stop_lease(self) -> None:
        if self._lease is not None:
            self._lease.set()
            self._lease = None

    def new_pod(self) -> object:
        hooks = self.broker.hooks
        return hooks.on_new_pod(self.watch.kernel_id) if hooks.on_new_pod is not None else None

    def check(self, memory: object, mode: object, cores: object) -> object:
        return self.broker.check(memory, mode, cores, self.watch.kernel_id)

    # ---- running -------------------------------------------------------------------------------

    async def look(self) -> PodEnd | None:
        """The pod as the broker sees it: None while it runs (or the broker cannot say)."""
        try:
            view = await asyncio.to_thread(self.broker.client.call, "GET", self.route)
        except NoSuchKernelError:
            return PodEnd("the kernel pod is gone")
        except BackendUnavailableError as error:
            if not self._warned_unreachable:
                self.watch.log.warning(
                    "Kernel %s: taken as running while the broker is away: %s",
                    self.watch.kernel_id,
                    error,
                )
            self._warned_unreachable = True
            return None
        self._warned_unreachable = False
        if view["state"] == "ended":
            return PodEnd(str(view.get("reason") or "the pod ended"), int(view.get("exit_code") or 1))
        return None

    async def delete_pod(self, grace_period_seconds: int | None) -> None:
        grace = f"?grace={grace_period_seconds}" if grace_period_seconds is not None else ""
        try:
            await asyncio.to_thread(self.broker.client.call, "DELETE", self.route + grace, {})
        except BackendUnavailableError as error:
            self._collects_itself(error)

    async def remove(self) -> None:
        self._stop_lease()
        await asyncio.to_thread(self._withdraw)

    def describe(self) -> dict[str, Any]:
        return {"broker": self.broker.client.url}


__all__ = ["BrokerPods"]
