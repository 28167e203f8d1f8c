"""Errors whose message is the reason a person reads (the same text in REST, magics and logs)."""

from __future__ import annotations


class GPUShareError(Exception):
    """Base class; ``str(error)`` is a complete sentence for the user."""


class InvalidRequestError(GPUShareError, ValueError):
    """The request itself is wrong (size, mode, cores): nothing was reserved."""


class ModeUnavailableError(GPUShareError):
    """This node cannot honour the requested mode; the message says what is missing."""


class NoGPUError(GPUShareError):
    """The pool has no device at all."""


class DoesNotFitError(GPUShareError):
    """The request cannot be placed now (``when_full = "fail"``) or ever."""


class QueueTimeoutError(DoesNotFitError):
    """A queued request waited ``queue_timeout`` seconds without a place."""
