"""Our refusals reach the server log as their sentence, without a traceback.

jupyter_client logs every kernel start that raises with ``log.exception`` — a full traceback in
the terminal of whoever runs the server — and a start we refuse (a slice that does not fit, a
ledger that needs fixing) raises on purpose. The sentence is the whole story; the extension
installs this filter on the server's logger, and it drops the traceback of those records only.
"""

from __future__ import annotations

import logging

from ..errors import GPUShareError


class SentenceOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], GPUShareError):
            record.exc_info = None
            record.exc_text = None
        return True


def install(logger: object) -> None:
    """Add the filter to the server's logger once (an extension may be loaded again in one
    process); anything that is not a standard logger is left as it is."""
    target = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    if isinstance(target, logging.Logger) and not any(
        isinstance(existing, SentenceOnly) for existing in target.filters
    ):
        target.addFilter(SentenceOnly())
