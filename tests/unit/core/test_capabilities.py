"""Callers ask what a backend can do, never which it is: each backend's capabilities, and the one
error — ``NotOfferedError``, a 409 at the HTTP edge — for whatever a backend does not offer."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest
import yaml

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.capabilities import (
    KERNEL_PODS,
    LOCAL_BROKER,
    NODE_LEDGER,
    Capabilities,
    offline,
    through_a_broker,
)
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, GPUShareError, NotOfferedError
from jupyter_gpushare.core.payloads import CapabilitiesPayload
from jupyter_gpushare.http_errors import answerable, status_of
from jupyter_gpushare.kernel.pod_handle import PodSliceHandle

OPENAPI = Path(__file__).resolve().parents[3] / "jupyter_gpushare" / "openapi.yaml"


def test_the_node_ledger_offers_everything_in_place() -> None:
    assert NODE_LEDGER.payload() == {
        "can_request": True,
        "can_release": True,
        "can_suspend": True,
        "can_force_shrink": True,
        "resize_restarts": False,
    }
    NODE_LEDGER.require("can_suspend")  # nothing raised


def test_a_local_backend_says_what_it_offers(tmp_path: Path) -> None:
    backend = LocalBackend(GPUShare(simulate="1xT4-16GB", ledger_path=str(tmp_path / "ledger.sqlite")))
    try:
        assert backend.capabilities is NODE_LEDGER
    finally:
        backend.ledger.close()


def test_kernel_pods_give_nothing_back_and_restart_to_resize() -> None:
    assert KERNEL_PODS.payload() == {
        "can_request": False,
        "can_release": False,
        "can_suspend": False,
        "can_force_shrink": False,
        "resize_restarts": True,
    }
    with pytest.raises(NotOfferedError, match="holds its GPU memory for the pod's life"):
        KERNEL_PODS.require("can_release")


@pytest.mark.parametrize(
    ("capability", "action", "sentence"),
    [
        ("can_suspend", None, "suspend is not available through a GPU broker yet: nothing was changed"),
        ("can_suspend", "resume", "resume is not available through a GPU broker yet: nothing was changed"),
        (
            "can_force_shrink",
            None,
            "a forced shrink is not available through a GPU broker yet: nothing was changed",
        ),
    ],
)
def test_a_broker_refuses_what_it_does_not_offer_with_its_sentence(
    capability: str, action: str | None, sentence: str
) -> None:
    assert LOCAL_BROKER.can_release and not LOCAL_BROKER.resize_restarts
    with pytest.raises(NotOfferedError) as refused:
        LOCAL_BROKER.require(capability, action)
    assert str(refused.value) == sentence


@pytest.mark.parametrize("call", ["release", "suspend", "resume", "request"])
def test_a_pod_kernel_refuses_with_the_same_error_as_any_backend(call: str) -> None:
    handle = PodSliceHandle(environ={})
    method = getattr(handle, call)
    with pytest.raises(NotOfferedError) as refused:
        method("4G") if call == "request" else method()
    assert str(refused.value) == POD_HOLDS_ITS_GPU


def test_not_offered_is_one_status_at_the_http_edge() -> None:
    """409 wherever it is raised: the request is well formed, the kernel's backend refuses it
    (before, a broker's gap was a 400 in the kernel and a 409 through the server)."""
    for error in (
        NotOfferedError(POD_HOLDS_ITS_GPU),
        NotOfferedError(LOCAL_BROKER.refusal("can_suspend")),
    ):
        assert status_of(error) == 409
        answer = answerable(error)
        assert isinstance(answer, NotOfferedError) and status_of(answer) == 409


def test_the_payload_the_typed_dict_and_the_openapi_schema_name_the_same_flags() -> None:
    schema = yaml.safe_load(OPENAPI.read_text())["components"]["schemas"]
    flags = set(typing.get_type_hints(CapabilitiesPayload))
    assert set(schema["Capabilities"]["properties"]) == flags == set(NODE_LEDGER.payload())
    assert set(schema["Capabilities"]["required"]) == flags
    assert schema["Kernel"]["properties"]["capabilities"] == {"$ref": "#/components/schemas/Capabilities"}


def test_a_broker_offers_its_backends_capabilities_less_what_its_routes_do_not_carry() -> None:
    assert through_a_broker(NODE_LEDGER) == LOCAL_BROKER
    # A pod already offers neither: it keeps its own sentence, not the broker's.
    assert through_a_broker(KERNEL_PODS) == KERNEL_PODS


@pytest.mark.parametrize("capabilities", [NODE_LEDGER, LOCAL_BROKER, KERNEL_PODS])
def test_what_a_broker_says_it_offers_reaches_its_clients_whole(capabilities: Capabilities) -> None:
    said = json.loads(json.dumps(capabilities.to_wire()))
    assert Capabilities.from_wire(said) == capabilities


@pytest.mark.parametrize(
    "answer",
    [
        None,
        [],
        {"can_request": True},
        {**NODE_LEDGER.to_wire(), "can_release": "yes"},
        {**NODE_LEDGER.to_wire(), "refusals": {"x": 1}},
    ],
)
def test_a_malformed_answer_is_one_sentence(answer: object) -> None:
    with pytest.raises(GPUShareError, match=r"^the GPU broker's capabilities "):
        Capabilities.from_wire(answer)


def test_a_broker_out_of_reach_offers_nothing_and_says_why() -> None:
    why = "cannot reach the GPU broker at unix:/run/x.sock: no such file"
    offered = offline(why)
    assert not any(value for flag, value in offered.payload().items() if flag != "resize_restarts")
    for flag in ("can_request", "can_release", "can_suspend", "can_force_shrink"):
        with pytest.raises(NotOfferedError, match=re.escape(why)):
            offered.require(flag)
