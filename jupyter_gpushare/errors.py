"""Errors whose message is the reason a person reads (the same text in REST, magics and logs).

They are tornado ``HTTPError``s so that a refusal raised while jupyter_server's own
``POST /api/kernels`` starts a kernel reaches the client as a 4xx carrying our message, instead
of the server's opaque "Unhandled error" 500.
"""

from __future__ import annotations

from typing import ClassVar

from tornado.web import HTTPError

_LOGS_GET_MESSAGE = hasattr(HTTPError, "get_message")


class GPUShareError(HTTPError):
    """Base class; ``str(error)`` is a complete sentence for the user."""

    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(self.status, log_message=message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    @property
    def log_message(self) -> str:  # type: ignore[override]
        # tornado escapes "%" in a log_message given without arguments ("50%% does not fit"),
        # and jupyter_server's API handlers answer with log_message as it is. tornado >= 6.5
        # logs get_message() (this same text); older releases use log_message as a format.
        return self.message if _LOGS_GET_MESSAGE else self.message.replace("%", "%%")

    @log_message.setter
    def log_message(self, value: str | None) -> None:
        pass  # HTTPError.__init__ sets it; the message is the one truth

    def __reduce__(self) -> tuple[type, tuple[str]]:  # picklable across processes
        return (type(self), (self.message,))


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


class ConfigurationError(GPUShareError):
    """A ``c.GPUShare`` setting is invalid: the admin must fix the configuration."""

    status = 500


class NotYourSliceError(GPUShareError):
    """A caller tried to act on a slice that is not its own."""

    status = 403


class LedgerError(GPUShareError):
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
    """A REST body broke a limit (size, nesting, text) before any field was read."""
