"""Errors whose message is the reason a person reads (the same text in REST, magics and logs).

Plain exceptions: the pure core raises them without knowing about HTTP. Each class declares the
HTTP ``status`` a server answers it with — the status comes from the type, never from the text —
and :mod:`jupyter_gpushare.http_errors` turns them into HTTP answers at the edges (the REST
handlers, and the provisioners whose refusals jupyter_server's own ``POST /api/kernels`` reports).
"""

from __future__ import annotations

from typing import ClassVar

# What every front end says when a kernel pod is asked to give memory back (docs/how-it-works/ledger.md):
# the same words for a release, a shrink without a new pod, a suspend, in %gpu, REST and the panel.
POD_HOLDS_ITS_GPU = (
    "a kernel pod holds its GPU memory for the pod's life: it cannot give memory back (release, "
    "shrink or suspend) without a new pod; %gpu resize SIZE --restart makes a new pod of another "
    "size (the kernel's variables are lost), or shut the kernel down to free it"
)


class GPUShareError(Exception):
    """Base class; ``str(error)`` is a complete sentence for the user."""

    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type, tuple[str]]:  # picklable across processes
        return (self.plain_type(), (self.message,))

    @classmethod
    def plain_type(cls) -> type[GPUShareError]:
        """The domain class itself (an HTTP-answerable copy of an error reports its origin)."""
        return cls


class InvalidRequestError(GPUShareError, ValueError):
    """The request itself is wrong (size, mode, cores): nothing was reserved."""


class ModeUnavailableError(GPUShareError):
    """This node cannot honour the requested mode; the message says what is missing."""

    status = 409


class NoGPUError(GPUShareError):
    """The pool has no device at all."""

    status = 409


class DoesNotFitError(GPUShareError):
    """The request cannot be placed now (``when_full = "fail"``) or ever."""

    status = 409


class QueueTimeoutError(DoesNotFitError):
    """A queued request waited ``queue_timeout`` seconds without a place."""


class SimulationSpecError(ValueError):
    """The ``simulate`` description cannot be read (a ValueError, as traitlets' validators
    expect of a trait's value)."""


class ConfigurationError(GPUShareError):
    """A ``c.GPUShare`` setting is invalid: the admin must fix the configuration."""

    status = 500


class NotYourSliceError(GPUShareError):
    """A caller tried to act on a slice that is not its own."""

    status = 403


class NoSliceError(GPUShareError):
    """The kernel holds no slice for the operation to act on."""

    status = 409


class NoSuchKernelError(GPUShareError):
    """No kernel of that id belongs to the caller (another user's kernel reads the same)."""

    status = 404


class NeedsRestartError(GPUShareError):
    """The change needs a kernel restart and was not asked for with ``--restart``."""

    status = 409


class NotOfferedError(GPUShareError):
    """What was asked is not offered by this kernel's backend (a kernel pod cannot give memory
    back, a GPU broker does not suspend yet): nothing changed. One error for every such gap,
    whatever the backend; a caller that wants to know beforehand reads the backend's
    :class:`~jupyter_gpushare.core.capabilities.Capabilities`. 409: the request is well formed, and
    the kernel's own circumstances (where its slice comes from) are what refuse it."""

    status = 409


class CannotSuspendError(GPUShareError):
    """The kernel's GPU state cannot be suspended (no driver support, MIG, several CUDA
    processes, not enough host memory, a failed checkpoint); it keeps its slice. ``why`` is the
    reason alone, for a caller that then does something else (the idle timer releases)."""

    status = 409

    def __init__(self, message: str, why: str | None = None) -> None:
        super().__init__(message)
        self.why = why or message


class ResumeError(GPUShareError):
    """A suspended kernel's GPU state could not be restored; the message says whether it stays
    suspended or is lost."""

    status = 409


class NoAccountingError(GPUShareError):
    """This backend keeps no accounting (what kernels reserved and used): the node ledger does,
    on the local backend and through its broker."""

    status = 501


class BackendUnavailableError(GPUShareError):
    """What holds the pool (the cluster's API, the server a kernel pod reports to) cannot be
    reached or refused; the message says which and why."""

    status = 503


class NotAuthenticatedError(GPUShareError):
    """A caller of the broker presented no identity it can check (no token, an unknown one)."""

    status = 401


class TokenRefusedError(GPUShareError):
    """The broker's hub does not accept the presented token (unknown, expired, revoked, or not
    a user's)."""

    status = 403


class LedgerError(BackendUnavailableError):
    """The node ledger file cannot be used now; the message names the file and the fix.

    503: the request may be fine, the node's accounting is not. Nothing was reserved.
    """

    status = 503


class LedgerMissingError(LedgerError):
    """The ledger file is gone while live processes still hold the deleted one."""


class LedgerReplacedError(LedgerError):
    """Another file took the ledger's place while processes still hold the previous one."""


class LedgerDamagedError(LedgerError):
    """The file is not a ledger any more: garbage, truncated, or sqlite calls it malformed."""


class LedgerReadOnlyError(LedgerError):
    """This process may not write the ledger file or its directory."""


class LedgerBusyError(LedgerError):
    """The ledger stayed locked longer than the lock timeout."""


class RequestBodyError(InvalidRequestError):
    """A request broke a limit (size, nesting, text, a kernel id) before any field was used."""


class BodyTooLargeError(RequestBodyError):
    """A body larger than any route needs (nothing of it was read as JSON)."""

    status = 413


class HeadersTooLargeError(RequestBodyError):
    """A request line and headers larger than any caller sends."""

    status = 431
