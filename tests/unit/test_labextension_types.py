"""The JupyterLab extension's payload types cannot drift from the OpenAPI document.

``labextension/src/types.ts`` mirrors the schemas of ``jupyter_gpushare/openapi.yaml`` by hand
(each interface names its schema with ``@schema``). This test reads both and compares every
property: its name, whether it is optional, and its type — base type, nullability, enum values
and array elements, with ``$ref``s followed. A field added, renamed, retyped or made nullable
on one side only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TYPES = REPO / "labextension" / "src" / "types.ts"
OPENAPI = REPO / "jupyter_gpushare" / "openapi.yaml"

# The schemas the extension reads or sends; each must have its TypeScript mirror.
MIRRORED = {
    "Mode",
    "Pool",
    "Device",
    "MigInstance",
    "QueueEntry",
    "Kernel",
    "Capabilities",
    "Resize",
    "UsageEvent",
    "Config",
    "Fit",
    "Error",
}

Atom = Any  # a str ("number", "null", "'queued'", an interface name) or ("array", frozenset)
TypeSet = frozenset[Atom]

DECLARATION = re.compile(
    r"/\*\*(?P<doc>(?:(?!\*/).)*?)@schema\s+(?P<schema>\w+)(?:(?!\*/).)*\*/\s*"
    r"export\s+(?:interface\s+(?P<interface>\w+)\s*\{(?P<body>.*?)\n\}"
    r"|type\s+(?P<alias>\w+)\s*=\s*(?P<type>[^;]+);)",
    re.DOTALL,
)
PROPERTY = re.compile(r"^\s*(?P<name>\w+)(?P<optional>\?)?\s*:\s*(?P<type>[^;]+);\s*$")


def read_typescript() -> tuple[dict[str, dict[str, tuple[bool, str]]], dict[str, str], dict[str, str]]:
    """Interfaces (name → {property: (optional, type)}), aliases (name → type), schema → TS name."""
    source = re.sub(r"//[^\n]*", "", TYPES.read_text())
    interfaces: dict[str, dict[str, tuple[bool, str]]] = {}
    aliases: dict[str, str] = {}
    named: dict[str, str] = {}
    for match in DECLARATION.finditer(source):
        if match["interface"]:
            properties: dict[str, tuple[bool, str]] = {}
            for line in match["body"].splitlines():
                if not line.strip():
                    continue
                prop = PROPERTY.match(line)
                assert prop, f"cannot read this line of {match['interface']} in types.ts: {line!r}"
                properties[prop["name"]] = (bool(prop["optional"]), " ".join(prop["type"].split()))
            interfaces[match["interface"]] = properties
            named[match["schema"]] = match["interface"]
        else:
            aliases[match["alias"]] = " ".join(match["type"].split())
            named[match["schema"]] = match["alias"]
    return interfaces, aliases, named


class Normaliser:
    """Both sides' types as sets of atoms, so that they can be compared."""

    def __init__(self) -> None:
        self.document = yaml.safe_load(OPENAPI.read_text())
        self.schemas: dict[str, Any] = self.document["components"]["schemas"]
        self.interfaces, self.aliases, self.named = read_typescript()
        self.interface_of_schema = {
            schema: name for schema, name in self.named.items() if name in self.interfaces
        }

    # ---- OpenAPI --------------------------------------------------------------------------

    def schema_type(self, schema: dict[str, Any]) -> TypeSet:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            if name in self.interface_of_schema:
                atoms: set[Atom] = {self.interface_of_schema[name]}
            else:
                atoms = set(self.schema_type(self.schemas[name]))
        elif "oneOf" in schema:
            atoms = set().union(*(self.schema_type(option) for option in schema["oneOf"]))
        elif len(schema.get("allOf", ())) == 1:  # a $ref with siblings (nullable, a description)
            atoms = set(self.schema_type(schema["allOf"][0]))
        elif "enum" in schema:
            atoms = {"null" if value is None else f"'{value}'" for value in schema["enum"]}
        elif schema.get("type") == "array":
            atoms = {("array", self.schema_type(schema["items"]))}
        elif schema.get("type") in ("integer", "number"):
            atoms = {"number"}
        elif schema.get("type") in ("string", "boolean"):
            atoms = {schema["type"]}
        elif schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
            atoms = {("map", self.schema_type(schema["additionalProperties"]))}  # Record<string, X>
        else:
            raise AssertionError(f"the test does not know this schema: {schema}")
        if schema.get("nullable"):
            atoms.add("null")
        return frozenset(atoms)

    # ---- TypeScript -----------------------------------------------------------------------

    def ts_type(self, text: str) -> TypeSet:
        atoms: set[Atom] = set()
        for part in (piece.strip() for piece in text.split("|")):
            if part.endswith("[]"):
                atoms.add(("array", self.ts_type(part[:-2])))
            elif part.startswith("Record<string,") and part.endswith(">"):
                atoms.add(("map", self.ts_type(part[len("Record<string,") : -1])))
            elif part in self.aliases:
                atoms |= self.ts_type(self.aliases[part])
            else:
                atoms.add(part.replace('"', "'"))
        return frozenset(atoms)


@pytest.fixture(scope="module")
def normaliser() -> Normaliser:
    return Normaliser()


def test_every_schema_the_extension_uses_has_a_typescript_mirror(normaliser: Normaliser) -> None:
    missing = MIRRORED - set(normaliser.named)
    assert not missing, f"types.ts has no `@schema` declaration for {sorted(missing)}"
    unknown = set(normaliser.named) - set(normaliser.schemas)
    assert not unknown, f"types.ts names schemas the OpenAPI document does not have: {sorted(unknown)}"


@pytest.mark.parametrize("schema_name", sorted(MIRRORED))
def test_the_typescript_type_matches_the_schema(normaliser: Normaliser, schema_name: str) -> None:
    schema = normaliser.schemas[schema_name]
    ts_name = normaliser.named[schema_name]
    if ts_name in normaliser.aliases:
        assert normaliser.ts_type(normaliser.aliases[ts_name]) == normaliser.schema_type(schema)
        return
    properties = normaliser.interfaces[ts_name]
    documented = schema.get("properties", {})
    assert set(properties) == set(documented), (
        f"{ts_name} has {sorted(set(properties) - set(documented))} that {schema_name} lacks, and lacks "
        f"{sorted(set(documented) - set(properties))}"
    )
    required = set(schema.get("required", []))
    for name, (optional, text) in properties.items():
        assert optional == (name not in required), f"{ts_name}.{name}: optional in one place only"
        expected = normaliser.schema_type(documented[name])
        actual = normaliser.ts_type(text)
        assert actual == expected, (
            f"{ts_name}.{name}: TypeScript {sorted(map(str, actual))} != {sorted(map(str, expected))}"
        )


def test_the_check_notices_a_drift(normaliser: Normaliser) -> None:
    """The comparison is not vacuous: a changed type or a missing field is seen."""
    kernel = normaliser.interfaces["IKernelSlice"]
    documented = normaliser.schemas["Kernel"]["properties"]
    assert normaliser.ts_type("number") != normaliser.schema_type(documented["memory_request"])
    assert normaliser.ts_type("'queued' | 'running'") != normaliser.schema_type(documented["state"])
    assert set(kernel) - {"warnings"} != set(documented)
