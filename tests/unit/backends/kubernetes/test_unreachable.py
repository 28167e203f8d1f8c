"""Why the Kubernetes API could not be reached, in a few words (k8s/cluster.py ``unreachable``),
from the errors urllib3 raises after its retries."""

from __future__ import annotations

import ssl

from urllib3.connection import HTTPSConnection
from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError, SSLError

from jupyter_gpushare.backends.kubernetes.cluster.cluster import unreachable


def after_retries(error: Exception) -> MaxRetryError:
    return MaxRetryError(None, "/api/v1/namespaces/kernels/secrets", error)  # type: ignore[arg-type]


def test_a_refused_connection_is_said_as_the_os_says_it() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise NewConnectionError(
                HTTPSConnection("127.0.0.1", 6443), "Failed to establish a new connection"
            ) from refused
    except NewConnectionError as error:
        assert unreachable(after_retries(error)) == "connection refused"


def test_a_server_that_never_answers_is_no_answer_in_time() -> None:
    timed_out = ReadTimeoutError(None, "/api/v1/pods", "Read timed out. (read timeout=60)")  # type: ignore[arg-type]
    assert unreachable(after_retries(timed_out)) == "no answer in time"


def test_what_has_no_os_reason_is_said_as_the_error_says_it() -> None:
    refused = SSLError(ssl.SSLCertVerificationError("certificate verify failed"))
    error = after_retries(refused)
    assert unreachable(error) == str(error)
