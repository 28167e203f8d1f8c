"""What a broker and its clients send each other: every value comes back as it left, every
refusal as the same error type, and a malformed description of a server's kernels is refused."""

from __future__ import annotations

import json

import pytest

from jupyter_gpushare.backends.broker_client.transport import error_from, error_payload
from jupyter_gpushare.backends.broker_client.wire import (
    device_from_json,
    device_to_json,
    outcome_from_json,
    outcome_to_json,
    record_from_json,
    record_to_json,
    server_kernels_from_json,
    server_kernels_to_json,
)
from jupyter_gpushare.backends.protocol import ServerKernels
from jupyter_gpushare.core.devices import Device, MigInstance
from jupyter_gpushare.core.errors import (
    BackendUnavailableError,
    DoesNotFitError,
    GPUShareError,
    InvalidRequestError,
    NoSuchKernelError,
    NotAuthenticatedError,
    QueueTimeoutError,
    TokenRefusedError,
)
from jupyter_gpushare.core.records import Placed, ProcessIdentity, Refused, SliceRecord, Waiting

RECORD = SliceRecord(
    kernel_id="k1",
    seq=3,
    state="running",
    owner="alice",
    server_id="alice@box:12",
    kernel_name="python3-gpu-4g",
    path="a.ipynb",
    mode="timeslice",
    placement="shared",
    size="4G",
    cores=None,
    device_uuid="GPU-1",
    unit_uuid="GPU-1",
    memory=4 << 30,
    whole_card=False,
    holder=ProcessIdentity(12, 1700000000.25),
    kernel=ProcessIdentity(34, 1700000001.5),
    requested_at=1700000002.0,
    placed_at=1700000002.1,
    token_hash="ab" * 32,
    warnings=("over its slice",),
)


def through_json(value: object) -> object:
    return json.loads(json.dumps(value))


def test_records_and_outcomes_come_back_as_they_left() -> None:
    assert record_from_json(through_json(record_to_json(RECORD))) == RECORD  # type: ignore[arg-type]
    for outcome in (
        Placed(RECORD),
        Waiting(2, "behind 1 earlier GPU request"),
        Refused("no", timed_out=True),
    ):
        assert outcome_from_json(through_json(outcome_to_json(outcome))) == outcome  # type: ignore[arg-type]


def test_devices_and_a_servers_kernels_come_back_as_they_left() -> None:
    device = Device(0, "GPU-1", "A100", 80 << 30, 1 << 30, 5, (MigInstance("MIG-1", "1g.10gb", 10 << 30),))
    assert device_from_json(through_json(device_to_json(device))) == device  # type: ignore[arg-type]
    server = ServerKernels(
        ids=frozenset({"a", "b"}),
        gpushare=frozenset({"a"}),
        starting=frozenset({"b"}),
        names={"a": ("python3-gpu-4g", "x.ipynb")},
        details={"b": "waiting"},
        warnings={"a": ("hot",)},
    )
    assert server_kernels_from_json(through_json(server_kernels_to_json(server))) == server


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"ids": "a"},
        {"ids": [1]},
        {"names": {"a": "python3"}},
        {"names": {"a": ["one"]}},
        {"details": {"a": 1}},
        {"warnings": {"a": "hot"}},
        {"details": []},
    ],
)
def test_a_malformed_description_of_a_servers_kernels_is_refused(body: object) -> None:
    with pytest.raises(ValueError):
        server_kernels_from_json(body)


@pytest.mark.parametrize(
    "error",
    [
        DoesNotFitError("6G does not fit"),
        QueueTimeoutError("waited 300 s"),
        NoSuchKernelError("no GPU kernel k of alice's"),
        NotAuthenticatedError("no token"),
        TokenRefusedError("expired"),
        BackendUnavailableError("the cluster is away"),
    ],
)
def test_refusals_come_back_as_the_same_type_and_status(error: GPUShareError) -> None:
    again = error_from(through_json(error_payload(error)), error.status)
    assert type(again) is type(error) and str(again) == str(error) and again.status == error.status


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, NoSuchKernelError),
        (409, DoesNotFitError),
        (400, InvalidRequestError),
        (502, BackendUnavailableError),
    ],
)
def test_an_answer_of_unknown_type_keeps_its_kind_of_status(status: int, kind: type[GPUShareError]) -> None:
    again = error_from({"message": "from a proxy"}, status)
    assert isinstance(again, kind) and again.status // 100 == status // 100 and str(again) == "from a proxy"
    assert str(error_from("<html>", status))  # never an empty sentence
