"""Domain errors at the HTTP edge: the answer a server gives for each, by its type.

Used by the REST handlers and by the provisioners: a refusal raised while jupyter_server's own
``POST /api/kernels`` starts a kernel must reach the client as a 4xx carrying our sentence, and
jupyter_server answers a 4xx only for a tornado ``HTTPError``. :func:`answerable` makes a copy of
the error that is both — still a ``DoesNotFitError`` for callers that catch ours (a console, an
nbclient run), and an ``HTTPError`` with the type's status for jupyter_server.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, TypeVar

from tornado.web import HTTPError

from jupyter_gpushare.compat import ExactLogMessage
from jupyter_gpushare.core.errors import GPUShareError

_answerable: dict[type[GPUShareError], type[GPUShareError]] = {}
_lock = threading.Lock()


def status_of(error: BaseException) -> int:
    """The HTTP status for ``error``: its type's for ours, a tornado error's own, else 500."""
    if isinstance(error, GPUShareError):
        return error.status
    if isinstance(error, HTTPError):
        return int(error.status_code)
    return 500


def message_of(error: BaseException | None, status: int) -> str:
    """The sentence a client reads: ours, a tornado error's log message, else the status phrase."""
    if isinstance(error, GPUShareError):
        return str(error)
    if isinstance(error, HTTPError) and error.log_message:
        # get_message(), not log_message: tornado escapes "%" in the latter ("50%% ...").
        return str(error.get_message())
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown error"


def answerable(error: BaseException) -> BaseException:
    """``error`` as jupyter_server answers it: ours become also an ``HTTPError`` of their status."""
    if not isinstance(error, GPUShareError) or isinstance(error, HTTPError):
        return error
    cls = type(error)
    with _lock:
        http_class = _answerable.get(cls)
        if http_class is None:
            http_class = _answerable[cls] = type(
                cls.__name__,
                (cls, ExactLogMessage),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "plain_type": _plain(cls)},
            )
    copy: Any = http_class.__new__(http_class)
    copy.__dict__.update(error.__dict__)
    # No format arguments: tornado then shows and logs the sentence as it is ("50% does not fit").
    HTTPError.__init__(copy, error.status, log_message=str(error))
    copy.__traceback__ = error.__traceback__
    return copy  # type: ignore[no-any-return]


def _plain(cls: type[GPUShareError]) -> classmethod[GPUShareError, [], type[GPUShareError]]:
    return classmethod(lambda _: cls)


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[None]])


def answering_domain_errors(method: Handler) -> Handler:
    """A tornado handler method whose domain errors are answered with their status and sentence
    (tornado answers any other exception with a 500)."""

    @functools.wraps(method)
    async def answering(*args: Any, **kwargs: Any) -> None:
        try:
            await method(*args, **kwargs)
        except GPUShareError as error:
            raise answerable(error) from None

    return answering  # type: ignore[return-value]
