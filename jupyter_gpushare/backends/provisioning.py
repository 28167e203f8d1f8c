"""What a server asks of every gpushare kernel, whatever its kind: :class:`SliceProvisioner`.

Each backend's provisioner (:mod:`.local.provisioner`, :mod:`.kubernetes.provisioner`) is one,
and answers the questions below the same way, so a server never asks which it has. The
``gpushare-provisioner`` entry point (:func:`jupyter_gpushare.backends.provisioner.gpushare_provisioner`)
builds the configured one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import TraitError

from jupyter_gpushare.compat import forget_pending_kernel
from jupyter_gpushare.core import log_filter as refusals
from jupyter_gpushare.core.errors import GPUShareError
from jupyter_gpushare.core.slice_request import SliceRequest
from jupyter_gpushare.http_errors import answerable

REQUEST_TRAITS = ("gpu_memory", "gpu_mode", "gpu_cores")  # what a start may override
# What a server passes to a start: the notebook path, a listener, the request it checked.


class SliceProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """A kernel holding a GPU slice; which kind of kernel depends on ``GPUShare.backend``.

    What a server reads of every gpushare kernel, whatever its kind:
    ``state`` (what its slice or pod is doing, as a person reads it), ``ended_reason``,
    ``restarted_after``, ``resize_failure``, ``has_process``; :meth:`resize`, :meth:`give_back` and
    :meth:`token_matches`.
    """

    state: str = ""  # "waiting for a GPU slice: position 2 (…)", "running on gpu-node-2"…
    ended_reason: str | None = None  # why its pod or process ended, where known
    # Why the kernel's previous pod or process ended on its own, when jupyter_server restarted
    # it (its restarter, after an OOMKilled pod, say): the kernel runs again, but its variables
    # are gone, and its row must say why. None after a start, or a restart someone asked for.
    restarted_after: str | None = None
    resize_failure: str | None = None  # why the last resize did not happen, until the next one
    _on_state: Callable[[str], object] | None = None  # a server's listener, per start
    _launched: bool = False  # a first launch was prepared (later ones are restarts)

    async def post_launch(self, **kwargs: Any) -> None:
        # jupyter_server lists a kernel (GET /api/kernels, the culler) as soon as its start
        # returns, but gives it a last activity only a turn or two of the event loop later, when
        # it starts watching the kernel's messages: a list in between answered 500 (its model
        # formats None). A kernel is active from the moment it is launched.
        await super().post_launch(**kwargs)
        manager = self.parent
        if manager is not None and manager.has_trait("last_activity"):
            try:
                manager.last_activity  # noqa: B018 - unset, reading it raises (no default)
            except TraitError:
                manager.last_activity = datetime.now(timezone.utc)

    @property
    def has_process(self) -> bool:
        """Whether the kernel's process (or pod) was launched and has not been cleaned up."""
        return False

    async def resize(self, memory: object, restart: bool, force: bool = False) -> bool:
        """Change the kernel's slice to ``memory``; True when the kernel must restart to have it
        (the caller restarts it). Raises with the reason, changing nothing, when it cannot — a
        shrink below what the kernel holds among them, unless ``force``."""
        raise NotImplementedError

    async def give_back(self) -> None:
        """Give the kernel's slice back while it runs on (what its processes still hold stays
        reserved until freed), as ``%gpu release`` does in the kernel. Raises ``NotOfferedError``
        where the kind cannot (a pod holds its GPU for life)."""
        raise NotImplementedError

    async def suspend(self) -> None:
        """Move the kernel's GPU state to host memory and give its slice back; raises with the
        reason, the kernel keeping its slice, when it cannot."""
        raise NotImplementedError

    async def resume(self) -> None:
        """Wait for a slice like a start and restore the kernel's suspended GPU state."""
        raise NotImplementedError

    def token_matches(self, token: str | None) -> bool:
        """Whether ``token`` is the secret this kernel proves itself with."""
        raise NotImplementedError

    def checked_request(self, kwargs: dict[str, Any]) -> SliceRequest | None:
        """Take ``gpushare_checked`` out of ``kwargs`` (what reaches the kernel's launch must be
        jupyter_client's own) and return the request the server already checked for this start
        (``POST kernels``): a start is checked once. None on a restart (its size may have
        changed since: it is checked again) or for a start the server did not check."""
        checked = kwargs.pop("gpushare_checked", None)
        first, self._launched = not self._launched, True
        return checked if first and isinstance(checked, SliceRequest) else None

    def failed_start(self, error: BaseException) -> BaseException:
        """What to raise for a start that failed: the kernel leaves its manager's pending starts
        (or a server's shutdown would wait on it), and a refusal of ours becomes one that
        jupyter_server's own ``POST /api/kernels`` answers with its status and sentence."""
        forget_pending_kernel(getattr(self.parent, "parent", None), self.kernel_id)
        if isinstance(error, GPUShareError):
            # Its sentence, not a traceback, in the kernel manager's log (jupyter_client logs
            # the failed start with log.exception) and at the end of a command that lets it go.
            refusals.install(self.log)
            refusals.end_with_the_sentence()
        return answerable(error)

    def set_state(self, state: str) -> None:
        """Record what the kernel's start is doing, and tell the server's listener, if any."""
        if state == self.state:
            return
        self.state = state
        self.log.info("Kernel %s: %s", self.kernel_id, state)
        if self._on_state is not None:
            try:
                self._on_state(state)
            except Exception:  # a listener's failure must not fail the start
                self.log.exception("Kernel %s: the state listener failed", self.kernel_id)
