"""Errors whose message is the reason a person reads (the same text in REST, magics and logs).

They are tornado ``HTTPError``s so that a refusal raised while jupyter_server's own
``POST /api/kernels`` starts a kernel reaches the client as a 4xx carrying our message, instead
of the server's opaque "Unhandled error" 500.
"""

from __future__ import annotations

from typing import ClassVar

from tornado.web import HTTPError


class GPUShareError(HTTPError):
    """Base class; ``str(error)`` is a complete sentence for the user."""

    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(self.status, log_message=message)
        self.message = message

    def __str__(self) -> str:
        return self.message

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
