"""Our refusals as their sentence: in a log, and at the end of a command, without a traceback.

A start we refuse (a slice that does not fit, a limit, a ledger that needs fixing) raises on
purpose, and the sentence is the whole story. jupyter_client logs every kernel start that raises
with ``log.exception`` — a full traceback in the terminal of whoever runs the server, or a
``jupyter execute`` — and a command (nbclient's ``jupyter execute``, ``jupyter nbconvert
--execute``, papermill) that does not catch the refusal ends with Python's traceback of it.
:func:`install` drops the traceback of our refusals' log records; :func:`end_with_the_sentence`
makes an uncaught refusal end its command with one line. Everything else keeps its traceback.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

from jupyter_gpushare.core.errors import GPUShareError


class SentenceOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], GPUShareError):
            record.exc_info = None
            record.exc_text = None
        return True


def install(logger: object) -> None:
    """Add the filter to a logger once (an extension may be loaded again in one process, a
    provisioner fails many starts); anything that is not a standard logger is left as it is."""
    target = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    if isinstance(target, logging.Logger) and not any(
        isinstance(existing, SentenceOnly) for existing in target.filters
    ):
        target.addFilter(SentenceOnly())


def end_with_the_sentence() -> None:
    """Make a refusal of ours that no caller catches end the process with its sentence instead
    of a traceback (Python's exit status stays 1). Called where a kernel start is refused, so
    only a process that starts gpushare kernels gets it; any other exception goes to the hook
    that was there before."""
    previous = sys.excepthook
    if isinstance(previous, _SentenceHook):
        return
    sys.excepthook = _SentenceHook(previous)


class _SentenceHook:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(
        self, kind: type[BaseException], error: BaseException, traceback: TracebackType | None
    ) -> None:
        if isinstance(error, GPUShareError):
            print(f"No kernel was started: {error}", file=sys.stderr)
        else:
            self.previous(kind, error, traceback)


__all__ = ["SentenceOnly", "end_with_the_sentence", "install"]
