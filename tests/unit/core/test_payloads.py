"""The Python payload types (jupyter_gpushare/core/payloads.py) cannot drift from the OpenAPI document.

Each TypedDict mirrors one schema of ``openapi.yaml``: the same properties, the same ones
required, and Python types that admit what the schema admits (nullable where it is nullable).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import yaml

from jupyter_gpushare.core import payloads

OPENAPI = Path(payloads.__file__).parents[1] / "openapi.yaml"
MIRRORS = {
    "Pool": payloads.PoolPayload,
    "Device": payloads.DevicePayload,
    "MigInstance": payloads.MigPayload,
    "QueueEntry": payloads.QueuePayload,
    "Kernel": payloads.KernelPayload,
    "UsageEvent": payloads.StatusPayload,
}
SCALARS = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def schemas() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI.read_text())["components"]["schemas"]  # type: ignore[no-any-return]


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = schemas()[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def python_types(hint: Any) -> set[Any]:
    """The runtime classes a type hint admits (None for None)."""
    hint = (typing.get_origin(hint) is typing.NotRequired and typing.get_args(hint)[0]) or hint
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return {kind for argument in typing.get_args(hint) for kind in python_types(argument)}
    if origin is typing.Literal:
        return {type(value) for value in typing.get_args(hint)}
    if hint is type(None):
        return {None}
    if origin is not None:
        return {origin}
    if typing.is_typeddict(hint):
        return {dict}
    return {hint}


@pytest.mark.parametrize("schema_name", sorted(MIRRORS))
def test_the_typed_dict_has_the_schemas_properties(schema_name: str) -> None:
    schema = resolve(schemas()[schema_name])
    mirror = MIRRORS[schema_name]
    assert set(mirror.__annotations__) == set(schema["properties"]), schema_name
    assert set(mirror.__required_keys__) == set(schema.get("required", [])), schema_name


@pytest.mark.parametrize("schema_name", sorted(MIRRORS))
def test_each_property_admits_what_the_schema_admits(schema_name: str) -> None:
    hints = get_type_hints(MIRRORS[schema_name])
    for name, property_schema in resolve(schemas()[schema_name])["properties"].items():
        property_schema = resolve(property_schema)
        admitted = python_types(hints[name])
        kinds = {SCALARS[kind] for kind in [property_schema.get("type")] if kind}
        if property_schema.get("type") == "number":
            kinds.add(int)
        assert kinds <= admitted | ({int} if float in admitted else set()), (schema_name, name, admitted)
        nullable = property_schema.get("nullable", False)
        assert (None in admitted) == nullable, (schema_name, name, "nullable" if nullable else "not nullable")
