"""No kernel left behind: starts nobody waits for, kernels nobody uses, and a server that stops.

A browser tab closed while its start waited in the queue stops asking after that start; a tab
closed right after *Start* leaves a kernel that no notebook session refers to. Either would hold
GPU memory for nobody. Every few seconds the server looks: a queued start whose client has not
asked after it (``GET kernels/{id}``) for ``GPUShare.unused_kernel_timeout`` seconds is withdrawn,
and a gpushare kernel that no session refers to and no client is connected to for that long is
shut down. Until then ``GET kernels`` marks it ``unused`` and says when it goes, so the panel
and the picker show it for what it is.

When the server stops (SIGTERM, Ctrl-C), every start still waiting for its slice is withdrawn
before the kernels are shut down: a queued start must not be placed, and its kernel started,
after the server has shut its kernels down.

:func:`judge` decides (pure); :class:`Reclaimer` looks at the server and acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.compat import open_kernel_websockets, pending_kernel_starts
from jupyter_gpushare.core.errors import BackendUnavailableError
from jupyter_gpushare.server.context import GPUShareContext

SWEEP_EVERY = 2.0  # seconds between looks at the server's starts and kernels
SETTLE_WITHIN = 30.0  # seconds a stopping server waits for starts to end before it goes on


@dataclass(frozen=True)
class Verdict:
    """What one look decided: starts to withdraw, kernels to shut down, and since when each
    unused kernel has been unused (to carry to the next look)."""

    withdraw: frozenset[str] = frozenset()
    shut_down: frozenset[str] = frozenset()
    unused_since: Mapping[str, float] = field(default_factory=dict)


def judge(
    now: float,
    timeout: float,
    queued_last_asked: Mapping[str, float],
    kernels_in_use: Mapping[str, bool],
    unused_since: Mapping[str, float],
) -> Verdict:
    """Which queued starts to withdraw and which kernels to shut down (pure).

    ``queued_last_asked``: the starts still waiting in the queue, each with when its client last
    asked after it. ``kernels_in_use``: the server's running gpushare kernels, each with whether
    a session refers to it or a client is connected. ``unused_since``: the previous verdict's.
    ``timeout`` 0 (or less) reclaims nothing.
    """
    since = {
        kernel_id: unused_since.get(kernel_id, now)
        for kernel_id, in_use in kernels_in_use.items()
        if not in_use
    }
    if timeout <= 0:
        return Verdict(unused_since=since)
    return Verdict(
        withdraw=frozenset(k for k, asked in queued_last_asked.items() if now - asked >= timeout),
        shut_down=frozenset(k for k, first in since.items() if now - first >= timeout),
        unused_since=since,
    )


def connected_kernels() -> set[str]:
    """The kernels of this server a client is connected to now (by websocket)."""
    return {str(key).partition(":")[0] for key in open_kernel_websockets()}


def unused_warning(timeout: float) -> str:
    """What ``GET kernels`` says of a kernel no session refers to and no client uses."""
    if timeout <= 0:
        return "no notebook or console uses this kernel"
    return (
        "no notebook or console uses this kernel: it is shut down once unused for "
        f"{timeout:g} s (GPUShare.unused_kernel_timeout)"
    )


class Reclaimer:
    """Looks at one server's starts and kernels every :data:`SWEEP_EVERY` seconds and reclaims
    what nobody uses; settles every waiting start when the server stops."""

    def __init__(
        self, context: GPUShareContext, session_manager: Any, timeout: Callable[[], float], log: Any
    ) -> None:
        self.context = context
        self.log = log  # the server's
        self.session_manager = session_manager
        self.timeout = timeout
        self.unused_since: Mapping[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        context.unused = self.unused

    def unused(self) -> dict[str, str]:
        """The kernels that are unused now, each with what ``GET kernels`` says of it.

        The last look's verdict, less the kernels a client has connected to since: a notebook
        connects as soon as its session takes the kernel, and the picker must not take up a
        kernel in use as one left behind (the sessions are only read at the next look)."""
        warning = unused_warning(self.timeout())
        connected = connected_kernels()
        return {kernel_id: warning for kernel_id in self.unused_since if kernel_id not in connected}

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # a busy ledger, a session table being written: next round
                self.log.warning("jupyter_gpushare: the look for unused kernels failed", exc_info=True)
            await asyncio.sleep(SWEEP_EVERY)

    async def sweep(self) -> Verdict:
        """One look: withdraw and shut down what the timeout says, remember what is unused."""
        context = self.context
        queued = {}
        for start in context.starts.pending():
            if await asyncio.to_thread(context.backend.is_waiting, start.kernel_id):
                queued[start.kernel_id] = start.asked_at
        in_use = await self._kernels_in_use()
        verdict = judge(time.monotonic(), self.timeout(), queued, in_use, self.unused_since)
        self.unused_since = verdict.unused_since
        for kernel_id in verdict.withdraw:
            self.log.warning(
                "jupyter_gpushare: withdrew the queued start of kernel %s: its client stopped "
                "asking after it %g s ago (a closed browser tab?)",
                kernel_id,
                self.timeout(),
            )
            await context.release(kernel_id)
        for kernel_id in verdict.shut_down:
            kernel_name, path = context.name_of(kernel_id)
            self.log.warning(
                "jupyter_gpushare: shutting down kernel %s (%s%s): no notebook or console used it "
                "for %g s (GPUShare.unused_kernel_timeout)",
                kernel_id,
                kernel_name,
                f", {path}" if path else "",
                self.timeout(),
            )
            with contextlib.suppress(Exception):  # it may be going already
                await context.kernel_manager.shutdown_kernel(kernel_id)
        return verdict

    async def _kernels_in_use(self) -> dict[str, bool]:
        """The server's running gpushare kernels, each with whether anyone uses it."""
        context = self.context
        sessions = await self.session_manager.list_sessions() if self.session_manager else []
        referenced = {str((session.get("kernel") or {}).get("id")) for session in sessions}
        connected = connected_kernels()
        return {
            kernel_id: kernel_id in referenced or kernel_id in connected
            for kernel_id in context.kernel_manager.list_kernel_ids()
            if context.provisioner_of(kernel_id) is not None
        }

    async def settle_starts(self, within: float = SETTLE_WITHIN) -> None:
        """Before a stopping server shuts its kernels down: withdraw every start that waits in
        the queue, and let starts already placed finish (they are then shut down like any
        kernel); whatever is still starting after ``within`` seconds is cancelled."""
        self.stop()
        context = self.context
        manager = context.kernel_manager
        tasks: dict[str, asyncio.Future[Any]] = {s.kernel_id: s.task for s in context.starts.pending()}
        tasks.update(pending_kernel_starts(manager))
        if not tasks:
            return
        self.log.info("jupyter_gpushare: settling %d kernel start(s) before shutting down", len(tasks))
        for kernel_id, task in tasks.items():
            if await self._may_wait(kernel_id):
                context.cancel_start(kernel_id)
                task.cancel()
        _, still = await asyncio.wait(tasks.values(), timeout=within)
        for task in still:
            task.cancel()
        if still:
            await asyncio.wait(still, timeout=5.0)
        for kernel_id, task in tasks.items():
            if task.done() and kernel_id not in manager.list_kernel_ids():
                context.forget_start(kernel_id)

    async def _may_wait(self, kernel_id: str) -> bool:
        """Whether a start may still wait for its slice: so too where the ledger or the broker
        cannot say (a start that cannot be placed now must not be placed after the shutdown)."""
        try:
            return await asyncio.to_thread(self.context.backend.is_waiting, kernel_id)
        except BackendUnavailableError:
            return True


def settle_before_shutdown(kernel_manager: Any, reclaimer: Reclaimer) -> None:
    """Make the kernel manager's ``shutdown_all`` (what a stopping server calls) settle every
    start first. jupyter_server offers a plain server extension no hook of its own at shutdown
    (only extension apps have ``stop_extension``), and it shuts kernels down before it would
    stop anything else of ours."""
    shutdown_all = getattr(kernel_manager, "shutdown_all", None)
    if shutdown_all is None:  # no kernel manager of jupyter_server's kind: nothing to settle
        return

    async def settled_shutdown_all(now: bool = False) -> None:
        try:
            await reclaimer.settle_starts()
        except Exception:  # the kernels must be shut down whatever happened here
            reclaimer.log.exception("jupyter_gpushare: settling the kernel starts failed")
        try:
            result = shutdown_all(now=now)
            if asyncio.isfuture(result) or asyncio.iscoroutine(result):
                await result
        except Exception as error:
            # jupyter_server stops its event loop only once this returns: had it raised, the
            # server would run on after SIGTERM for ever. jupyter_client's shutdown_all ends at
            # the first kernel whose shutdown raised (it logged why) while the others' go on:
            # let those end too.
            reclaimer.log.error("jupyter_gpushare: a kernel's shutdown failed (%s); stopping anyway", error)
            under_way = [task for task in pending_kernel_starts(kernel_manager).values() if not task.done()]
            if under_way:
                await asyncio.wait(under_way, timeout=SETTLE_WITHIN)

    kernel_manager.shutdown_all = settled_shutdown_all
