"""``gpushare-provisioner`` for local kernels: a GPU slice around jupyter_client's local process.

Lifecycle (the kernel manager calls these in this order):

* ``pre_launch`` — validate the kernelspec's request, reserve a slice (waiting in the FIFO queue
  when the pool is full), then let the stock local provisioner prepare ports and the command, and
  add the slice's environment.
* ``launch_kernel`` — start the process, then tie the slice to its pid and start time so a crash
  frees it at the next reconciliation.
* ``cleanup(restart=True)`` — keep the slice for the restarted process; ``cleanup()`` releases it.

The slice comes from the node ledger in this process, or — with ``c.GPUShare.broker_url`` — from
the GPU broker, which checks that the kernel process belongs to the caller before it attaches it:
the provisioner holds their :class:`~jupyter_gpushare.backends.protocol.NodeSlices` (``slices``),
and checks a request through the service API (``backend``) as a server does.
The kernel's traffic is encrypted with CurveZMQ wherever other users share the node (a broker, or
a ledger file other users may write); elsewhere the kernel manager's own policy decides
(:mod:`.encryption`).
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Callable
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Any as AnyTrait

from jupyter_gpushare.backends import backend_for, node_slices_for
from jupyter_gpushare.backends.local.encryption import local_encryption
from jupyter_gpushare.backends.protocol import Backend, NodeSlices
from jupyter_gpushare.backends.provisioning import REQUEST_TRAITS, SliceProvisioner
from jupyter_gpushare.config import GPUShare, load_settings
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import BackendUnavailableError

# Held memory and suspend/resume need the node ledger itself; a broker does not offer them yet.

KERNEL_EXTENSION = "jupyter_gpushare.kernel"


def _is_ipykernel(cmd: list[str]) -> bool:
    return any("ipykernel" in part for part in cmd)


async def _in_a_worker(work: Callable[[], None]) -> None:
    """``work`` in a worker thread; in this thread where none may start any more (a command's
    cleanup at interpreter exit: nbclient shuts its kernel down from an atexit callback)."""
    try:
        await asyncio.to_thread(work)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        work()


class LocalGPUShareProvisioner(LocalProvisioner, SliceProvisioner):  # type: ignore[misc]
    """A local kernel process holding a GPU slice from the node ledger."""

    # Plain traits, validated in pre_launch so a bad kernelspec fails with our message listing
    # the accepted forms, not a traitlets type error.
    gpu_memory = AnyTrait(None, help="Slice size (docs/users/sizes.md); None takes GPUShare.default_memory.")
    gpu_mode = AnyTrait(None, help="Sharing mode; None takes GPUShare.default_mode.")
    gpu_cores = AnyTrait(None, help="Percent of SMs, where the mode can limit it.")

    _settings: GPUShare | None = None
    _backend: Backend | None = None
    _slices: NodeSlices | None = None

    @property
    def settings(self) -> GPUShare:
        if self._settings is None:
            self._settings = load_settings(self.config)
        return self._settings

    @property
    def backend(self) -> Backend:
        """Where a request is checked (the service API, as a server checks one)."""
        if self._backend is None:
            self._backend = backend_for(self.settings)
        return self._backend

    @property
    def slices(self) -> NodeSlices:
        """Where the kernel's slice is taken, followed, changed and freed."""
        if self._slices is None:
            self._slices = node_slices_for(self.settings)
        return self._slices

    @property
    def has_process(self) -> bool:
        return self.process is not None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        slices = self.slices
        # A start through the gpushare REST API may override the kernelspec's request.
        for name in REQUEST_TRAITS:
            if name in kwargs:
                setattr(self, name, kwargs.pop(name))
        self._on_state = kwargs.pop("gpushare_on_state", None)
        checked = self.checked_request(kwargs)
        session_path = kwargs.pop("gpushare_path", None) or (kwargs.get("env") or {}).get(
            "JPY_SESSION_NAME", ""
        )
        try:
            encryption = local_encryption(self.settings, self.parent)
            request = checked or self.backend.check(
                self.gpu_memory, self.gpu_mode, self.gpu_cores, self.kernel_id
            )
            record = await slices.acquire(
                self.kernel_id,
                request,
                kernel_name=getattr(self.parent, "kernel_name", "") or "",
                path=session_path,
                on_wait=self._report_wait,
            )
        except BaseException as error:
            raise self.failed_start(error) from None
        try:
            if encryption:
                # jupyter_client (>= 8.10) makes CurveZMQ keys, writes them in the connection file
                # (the kernel's own, mode 0600) and gives them to the manager's clients.
                kwargs["transport_encryption"] = encryption
            kwargs = await super().pre_launch(**kwargs)
            env: dict[str, str] = kwargs["env"]
            for name in env_names.SLICE_VARIABLES & env.keys():
                del env[name]  # a slice inherited from a parent kernel is not this kernel's
            env.update(slices.kernel_env(record))
            if _is_ipykernel(kwargs["cmd"]):
                # The %gpu magics and the framework caps, loaded before any user code runs.
                kwargs["cmd"] = [*kwargs["cmd"], f"--ext={KERNEL_EXTENSION}"]
        except BaseException as error:
            slices.free(self.kernel_id)
            raise self.failed_start(error) from None
        self.set_state(f"holds {record.size} on {record.unit_uuid}")
        self.log.info(
            "Kernel %s holds a %s GPU slice (%d bytes) on %s",
            self.kernel_id,
            record.mode,
            record.memory,
            record.unit_uuid,
        )
        return kwargs

    def _report_wait(self, position: int, reason: str) -> None:
        self.log.warning(
            "Kernel %s waits for a GPU slice at queue position %d: %s", self.kernel_id, position, reason
        )
        self.set_state(f"waiting for a GPU slice: position {position} in the queue ({reason})")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        try:
            connection_info = await super().launch_kernel(cmd, **kwargs)
        except BaseException as error:
            self.slices.free(self.kernel_id)
            raise self.failed_start(error) from None
        try:
            self.slices.attach_kernel(self.kernel_id, self.pid)
        except BaseException as error:
            await super().kill()
            await super().cleanup()
            await asyncio.to_thread(self._free_quietly)
            raise self.failed_start(error) from None
        self.slices.start_monitoring()
        return connection_info

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        # In a worker thread: a ledger that waits (a held lock, a file being put back) holds
        # neither the server's event loop nor the other kernels' shutdowns.
        if restart:
            # Between the old process and the new one, the slice follows this process.
            await _in_a_worker(lambda: self._quietly(lambda: self.slices.attach_kernel(self.kernel_id, None)))
        else:
            await _in_a_worker(self._free_quietly)

    def _free_quietly(self) -> None:
        self._quietly(lambda: self.slices.free(self.kernel_id))

    def _quietly(self, change: Callable[[], object]) -> None:
        # Never raises: a shutdown must end whatever the ledger or the broker does (a server
        # stopping on SIGTERM above all; jupyter_server never stops its event loop once a
        # kernel's shutdown raised). The slice's process is gone, so reconciliation frees the
        # slice once the ledger (or the broker) is back.
        try:
            change()
        except BackendUnavailableError as fault:
            self.slices.report_fault(fault)  # the fault once, however many kernels meet it
            self.log.warning(
                "Kernel %s: its GPU slice stays recorded until the ledger or the broker is usable "
                "again, which then frees it",
                self.kernel_id,
            )
        except Exception:
            self.log.exception("Kernel %s: its GPU slice could not be freed", self.kernel_id)

    # ---- what a server asks of every gpushare kernel ---------------------------------------

    async def resize(self, memory: object, restart: bool, force: bool = False) -> bool:
        """Resize in place in the ledger; a restart only when asked (JAX/TensorFlow read their
        cap only at start)."""
        await asyncio.to_thread(self.slices.resize, self.kernel_id, memory, force)
        return restart

    async def give_back(self) -> None:
        # What %gpu release does in the kernel: what its processes still hold stays reserved.
        await asyncio.to_thread(self.slices.give_back, self.kernel_id)

    async def suspend(self) -> None:
        """This process started the kernel: it has the driver checkpoint it (a helper process
        does the calls) and gives the slice back once the driver says it is done."""
        outcome = await asyncio.to_thread(self.slices.suspend, self.kernel_id)
        self.set_state(f"suspended ({outcome.state.state_bytes} bytes of GPU state in host memory)")

    async def resume(self) -> None:
        outcome = await self.slices.resume(self.kernel_id, on_wait=self._report_wait)
        self.set_state(f"holds {outcome.record.size} on {outcome.record.unit_uuid} (resumed)")

    def token_matches(self, token: str | None) -> bool:
        own = self.slices.token_for(self.kernel_id)
        return bool(token and own) and hmac.compare_digest(str(token), str(own))

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info["gpushare"] = {"slices": self.backend.location(), "pid": os.getpid()}
        return info
