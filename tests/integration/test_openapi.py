"""The shipped OpenAPI document: valid, complete, and what a real server answers
(docs/reference/rest-api.md)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import yaml
from openapi_spec_validator import validate as validate_openapi

import jupyter_gpushare
from jupyter_gpushare.core.sizes import GiB

from ..support.nodes import Node
from ..support.polling import wait_until
from ..support.servers import JupyterServer, Response, start_server

pytestmark = pytest.mark.integration

OPENAPI = Path(jupyter_gpushare.__file__).parent / "openapi.yaml"
API = "/api/gpushare"
# OpenAPI keywords that JSON Schema does not know (``nullable`` is translated, these dropped).
OPENAPI_ONLY = {"nullable", "example", "discriminator", "xml", "externalDocs", "deprecated"}


def load_document() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI.read_text())  # type: ignore[no-any-return]


def to_json_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema 2020-12: ``nullable`` → ``null``, refs → ``$defs``.

    Strict as OpenAPI 3.0.3 reads it: ``nullable`` adds null to the ``type`` next to it (an
    ``enum`` must list null itself); a nullable schema without a type allows null as well.
    """
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: to_json_schema(value) for key, value in node.items() if key not in OPENAPI_ONLY}
    if isinstance(schema.get("$ref"), str):
        schema["$ref"] = schema["$ref"].replace("#/components/schemas/", "#/$defs/")
    if node.get("nullable") is True:
        if "type" in schema:
            schema["type"] = [schema["type"], "null"]
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


class Contract:
    """The document's response schemas, as validators of real responses."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.defs = {
            name: to_json_schema(schema) for name, schema in document["components"]["schemas"].items()
        }

    def validator(self, schema: dict[str, Any]) -> jsonschema.protocols.Validator:
        full = {**to_json_schema(schema), "$defs": self.defs}
        jsonschema.Draft202012Validator.check_schema(full)
        return jsonschema.Draft202012Validator(full)

    def component(self, name: str) -> jsonschema.protocols.Validator:
        return self.validator({"$ref": f"#/components/schemas/{name}"})

    def response(self, path: str, method: str, status: int) -> dict[str, Any]:
        operation = self.document["paths"][path][method.lower()]
        responses = operation["responses"]
        assert str(status) in responses, f"{method} {path} answered {status}, which is not documented"
        response = responses[str(status)]
        if "$ref" in response:
            response = self.document["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
        return response  # type: ignore[no-any-return]

    def check(self, reply: Response, path: str, method: str, status: int | None = None) -> Any:
        """Assert ``reply`` is documented for ``method path`` and its body fits the schema."""
        if status is not None:
            assert reply.status == status, (reply.status, reply.body)
        response = self.response(path, method, reply.status)
        content = response.get("content")
        if content is None:
            assert reply.body is None, f"{method} {path} {reply.status} has a body: {reply.body!r}"
            return None
        schema = content["application/json"]["schema"]
        errors = sorted(self.validator(schema).iter_errors(reply.body), key=str)
        assert not errors, f"{method} {path} {reply.status}: " + "; ".join(
            f"{list(error.absolute_path)}: {error.message}" for error in errors
        )
        return reply.body


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Contract(load_document())


@pytest.fixture
def server(node: Node) -> Iterator[JupyterServer]:
    running = start_server(node)
    yield running
    running.stop()


# ---- the document itself ----------------------------------------------------------------------


def test_the_document_is_valid_openapi_3() -> None:
    document = load_document()
    validate_openapi(document)
    assert document["openapi"] == "3.0.3"
    assert [server["url"] for server in document["servers"]] == [API]
    scheme = document["components"]["securitySchemes"]["token"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "Authorization")
    for name in ("Pool", "Device", "MigInstance", "QueueEntry", "Kernel", "KernelStart", "Resize", "Error"):
        assert name in document["components"]["schemas"], name
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(to_json_schema(schema))


def test_response_objects_reject_unknown_keys(contract: Contract) -> None:
    """So that a key added to (or renamed in) views.py without the document fails the tests."""
    for name in ("Pool", "Device", "MigInstance", "QueueEntry", "Kernel", "UsageEvent", "Fit", "Error"):
        assert contract.document["components"]["schemas"][name]["additionalProperties"] is False, name


def test_the_document_lists_every_route_and_method_the_extension_registers(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traitlets.config import Config

    from jupyter_gpushare.server import extension, kernel_routes, routes

    added: list[tuple[str, type]] = []

    class WebApp:
        settings: dict[str, Any] = {"base_url": "/base/"}  # noqa: RUF012

        def add_handlers(self, host: str, specs: list[tuple[str, type]]) -> None:
            added.extend(specs)

    class ServerApp:
        config = Config()
        kernel_manager = None
        kernel_spec_manager = None
        web_app = WebApp()

        log = SimpleNamespace(info=lambda *args: None, warning=lambda *args: None)

    monkeypatch.setattr(extension.metrics, "register", lambda snapshot, totals=None: None)
    extension.load_jupyter_server_extension(ServerApp())

    registered: dict[str, set[str]] = {}
    for pattern, handler in added:
        assert pattern.startswith("/base/api/gpushare/"), pattern
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.removeprefix("/base/api/gpushare"))
        methods = {
            method
            for method in ("get", "post", "put", "patch", "delete")
            if any(
                method in cls.__dict__
                for cls in handler.__mro__
                if issubclass(cls, (routes.GPUShareHandler, kernel_routes.KernelTokenHandler))
            )
        }
        registered[path] = methods
    documented = {
        path: {method for method in item if method in ("get", "post", "put", "patch", "delete")}
        for path, item in load_document()["paths"].items()
    }
    assert documented == registered


# ---- a real server's answers ------------------------------------------------------------------


def read_first_event(server: JupyterServer, timeout: float = 30) -> tuple[dict[str, str], Any]:
    """The fields of the first ``usage`` event of ``GET stream`` and its decoded data."""
    request = urllib.request.Request(
        f"{server.url}{API}/stream", headers={"Authorization": f"token {server.token}"}
    )
    fields: dict[str, str] = {}
    with urllib.request.urlopen(request, timeout=timeout) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        while True:
            line = stream.readline()
            assert line, "the stream ended before its first event"
            text = line.decode().rstrip("\n")
            if not text:
                if "data" in fields:
                    break
                fields.clear()  # the opening `retry:` block
                continue
            name, _, value = text.partition(":")
            fields[name] = value.removeprefix(" ")
    return fields, json.loads(fields["data"])


def test_real_responses_match_the_document(contract: Contract, node: Node, server: JupyterServer) -> None:
    def call(method: str, path: str, template: str, body: Any = None, status: int | None = None) -> Any:
        return contract.check(server.request(method, f"{API}{path}", body), template, method, status)

    pool = call("GET", "/pool", "/pool", status=200)
    assert pool["simulated"] is True and pool["queue"] == []
    assert [device["memory_total"] for device in pool["devices"]] == [80 * GiB]
    assert call("GET", "/kernels", "/kernels", status=200) == []
    assert "timeslice" in call("GET", "/config", "/config", status=200)["modes"]
    fits = call("GET", "/fit?gpu_memory=30G&gpu_memory=96G", "/fit", status=200)
    assert [fit["verdict"] for fit in fits] == ["now", "never"]
    call("GET", "/fit?gpu_memory=lots", "/fit", status=400)

    # Two 30G kernels run; a third waits in the queue.
    first = call("POST", "/kernels", "/kernels", {"name": "python3-gpu-30g"}, status=201)
    second = call(
        "POST", "/kernels", "/kernels", {"name": "python3-gpu-30g", "path": "work/a.ipynb"}, status=201
    )
    third = call(
        "POST", "/kernels", "/kernels", {"name": "python3-gpu-30g", "gpu_mode": "timeslice"}, status=202
    )
    assert (first["state"], second["state"], third["state"]) == ("running", "running", "queued")
    assert (first["memory_request"], first["device"]) == (30 * GiB, 0)
    assert third["queue_position"] == 1
    ids = [first["kernel_id"], second["kernel_id"], third["kernel_id"]]

    listed = call("GET", "/kernels", "/kernels", status=200)
    assert [kernel["state"] for kernel in listed] == ["running", "running", "queued"]
    pool = call("GET", "/pool", "/pool", status=200)
    assert pool["devices"][0]["memory_reserved"] == 60 * GiB
    assert [entry["kernel_id"] for entry in pool["queue"]] == [ids[2]]
    assert call("GET", f"/kernels/{ids[2]}", "/kernels/{kernel_id}", status=200)["state"] == "queued"
    # A queued request holds no slice to resize.
    call("PATCH", f"/kernels/{ids[2]}", "/kernels/{kernel_id}", {"gpu_memory": "8G"}, status=409)

    # Refusals, each a documented status with {"message"}.
    kernel = "/kernels/{kernel_id}"
    for body in ({"gpu_memory": "lots"}, {"gpu_memory": None}, {"gpu_memory": 4, "name": "x"}, {}, [1]):
        call("PATCH", f"/kernels/{ids[0]}", kernel, body, status=400)
    refused = call("PATCH", f"/kernels/{ids[0]}", kernel, {"gpu_memory": "60G"}, status=409)
    assert "does not fit" in refused["message"]
    for body in ({"gpu_memory": "0G"}, {"name": 3}, {"name": "no-such-kernelspec"}, {"gpu_cores": 101}):
        call("POST", "/kernels", "/kernels", body, status=400)
    for method, path, template in (
        ("GET", "/kernels/no-such-kernel", kernel),
        ("PATCH", "/kernels/no-such-kernel", kernel),
        ("DELETE", "/kernels/no-such-kernel/gpu", "/kernels/{kernel_id}/gpu"),
    ):
        call(method, path, template, {"gpu_memory": "1G"} if method == "PATCH" else None, status=404)

    # A resize, then a release: the kernel keeps running without its slice.
    resized = call("PATCH", f"/kernels/{ids[0]}", kernel, {"gpu_memory": "10G"}, status=200)
    assert (resized["memory_request"], resized["size"], resized["state"]) == (10 * GiB, "10G", "running")
    # 10G + 30G now leave room for the queued 30G.
    wait_until(lambda: call("GET", f"/kernels/{ids[2]}", kernel, status=200)["state"] == "running", 60)
    call("DELETE", f"/kernels/{ids[1]}/gpu", "/kernels/{kernel_id}/gpu", status=204)
    released = call("GET", f"/kernels/{ids[1]}", kernel, status=200)
    assert released["state"] == "released" and released["memory_request"] is None
    call("DELETE", f"/kernels/{ids[1]}/gpu", "/kernels/{kernel_id}/gpu", status=409)
    call("PATCH", f"/kernels/{ids[1]}", kernel, {"gpu_memory": "1G"}, status=409)
    assert sorted(k["state"] for k in call("GET", "/kernels", "/kernels", status=200)) == [
        "released",
        "running",
        "running",
    ]
    call("GET", "/pool", "/pool", status=200)

    # One event of the live stream.
    fields, payload = read_first_event(server)
    assert fields["event"] == "usage" and int(fields["id"]) >= 1
    errors = list(contract.component("UsageEvent").iter_errors(payload))
    assert not errors, [error.message for error in errors]
    assert {kernel["kernel_id"] for kernel in payload["kernels"]} == set(ids)


def test_every_route_refuses_a_request_without_credentials(contract: Contract, server: JupyterServer) -> None:
    for path, template, method in (
        ("/pool", "/pool", "GET"),
        ("/kernels", "/kernels", "GET"),
        ("/kernels", "/kernels", "POST"),
        ("/kernels/x", "/kernels/{kernel_id}", "GET"),
        ("/kernels/x", "/kernels/{kernel_id}", "PATCH"),
        ("/kernels/x/gpu", "/kernels/{kernel_id}/gpu", "DELETE"),
        ("/stream", "/stream", "GET"),
        ("/config", "/config", "GET"),
        ("/fit?gpu_memory=4G", "/fit", "GET"),
        ("/openapi.yaml", "/openapi.yaml", "GET"),
    ):
        request = urllib.request.Request(
            f"{server.url}{API}{path}",
            method=method,
            data=b"{}" if method in ("POST", "PATCH") else None,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                raise AssertionError(f"{method} {path} answered {reply.status} without credentials")
        except urllib.error.HTTPError as error:
            reply = Response(error.code, json.loads(error.read()))
        assert reply.status in (401, 403), (method, path, reply.status)
        contract.check(reply, template, method)


def test_the_server_serves_the_shipped_document_with_its_modes(server: JupyterServer) -> None:
    request = urllib.request.Request(
        f"{server.url}{API}/openapi.yaml", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200
        content_type = reply.headers["Content-Type"]
        text = reply.read().decode()
    # The shipped document takes any mode a package may add; the served one lists those installed
    # where the server runs (here this package's), and is otherwise the same text.
    shipped = load_document()
    assert "enum" not in shipped["components"]["schemas"]["Mode"]
    shipped["components"]["schemas"]["Mode"]["enum"] = ["exclusive", "mig", "mps", "timeslice", "vgpu"]
    served = yaml.safe_load(text)
    assert served == shipped
    validate_openapi(served)
    assert (
        text.replace('      enum: ["exclusive", "mig", "mps", "timeslice", "vgpu"]\n', "")
        == OPENAPI.read_text()
    )
    assert content_type.startswith("application/yaml"), f"served as {content_type}, documented as YAML"
