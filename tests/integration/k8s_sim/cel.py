"""A small evaluator of the CEL that DRA device selectors use — the subset the DRA presets and the
drivers' DeviceClasses emit, not CEL.

Supported: string (single or double quotes), integer and boolean literals; ``device.driver``,
``device.attributes[<domain>].<name>`` and ``device.capacity[<domain>].<name>`` (also
``[<name>]``); ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``&&``, ``||``, ``!`` and
parentheses; ``quantity("6Gi")`` with ``.compareTo(...)``; the string methods ``lowerAscii()``,
``contains()``, ``startsWith()`` and ``endsWith()``. An attribute a device does not have makes
the expression false for that device (Kubernetes reports it as an evaluation error, which also
keeps the device from being allocated). Anything else raises :class:`CelError`, so a selector
outside the subset fails the test loudly instead of matching by accident.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<number>\d+)
    | (?P<op>&&|\|\||==|!=|<=|>=|[<>!().\[\],])
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class CelError(ValueError):
    """An expression outside the supported subset, or a malformed one."""


class Missing(Exception):
    """A device attribute or capacity the device does not have."""


@dataclass(frozen=True)
class Quantity:
    value: int

    @staticmethod
    def parse(text: str) -> Quantity:
        text = str(text).strip()
        for suffixes in (_BINARY_SUFFIXES, _DECIMAL_SUFFIXES):
            for suffix, factor in suffixes.items():
                if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
                    return Quantity(int(float(text[: -len(suffix)]) * factor))
        if not text.isdigit():
            raise CelError(f"not a quantity: {text!r}")
        return Quantity(int(text))

    def compareTo(self, other: Quantity) -> int:  # CEL's name
        return (self.value > other.value) - (self.value < other.value)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            if text[position:].strip() == "":
                break
            raise CelError(f"cannot read {text[position:]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent into closures ``(device) -> value``."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self) -> str | None:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.index >= len(self.tokens):
            raise CelError("unexpected end of expression")
        token = self.tokens[self.index]
        if expected is not None and token[1] != expected:
            raise CelError(f"expected {expected!r}, found {token[1]!r}")
        self.index += 1
        return token

    def parse(self) -> Callable[[Mapping[str, Any]], Any]:
        node = self.disjunction()
        if self.index != len(self.tokens):
            raise CelError(f"unexpected {self.peek()!r}")
        return node

    def disjunction(self) -> Callable[[Mapping[str, Any]], Any]:
        node = self.conjunction()
        while self.peek() == "||":
            self.take()
            node = _either(node, self.conjunction())
        return node

    def conjunction(self) -> Callable[[Mapping[str, Any]], Any]:
        node = self.comparison()
        while self.peek() == "&&":
            self.take()
            node = _both(node, self.comparison())
        return node

    def comparison(self) -> Callable[[Mapping[str, Any]], Any]:
        node = self.unary()
        operator = self.peek()
        compare = {
            "==": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b,
        }.get(operator or "")
        if compare is None:
            return node
        self.take()
        left, right = node, self.unary()
        return lambda device: compare(left(device), right(device))

    def unary(self) -> Callable[[Mapping[str, Any]], Any]:
        if self.peek() == "!":
            self.take()
            inner = self.unary()
            return lambda device: not _truth(inner, device)
        return self.postfix()

    def postfix(self) -> Callable[[Mapping[str, Any]], Any]:
        node = self.primary()
        while self.peek() in (".", "["):
            if self.take()[1] == "[":
                key = self.disjunction()
                self.take("]")
                node = _subscript(node, key)
                continue
            _, member = self.take()
            node = _method(node, member, self.arguments()) if self.peek() == "(" else _member(node, member)
        return node

    def arguments(self) -> list[Callable[[Mapping[str, Any]], Any]]:
        self.take("(")
        arguments = []
        while self.peek() != ")":
            arguments.append(self.disjunction())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return arguments

    def primary(self) -> Callable[[Mapping[str, Any]], Any]:
        kind, text = self.take()
        if kind == "string":
            value = text[1:-1].encode().decode("unicode_escape")
            return lambda device: value
        if kind == "number":
            return lambda device: int(text)
        if text == "(":
            node = self.disjunction()
            self.take(")")
            return node
        if text in ("true", "false"):
            return lambda device: text == "true"
        if text == "device":
            return lambda device: device
        if text == "quantity" and self.peek() == "(":
            (argument,) = self.arguments()
            return lambda device: Quantity.parse(argument(device))
        raise CelError(f"unsupported name {text!r}")


Node = Callable[[Mapping[str, Any]], Any]


def _either(left: Node, right: Node) -> Node:
    return lambda device: _truth(left, device) or _truth(right, device)


def _both(left: Node, right: Node) -> Node:
    return lambda device: _truth(left, device) and _truth(right, device)


def _subscript(target: Node, key: Node) -> Node:
    return lambda device: _index(target(device), key(device))


def _member(target: Node, name: str) -> Node:
    return lambda device: _index(target(device), name)


def _method(target: Node, name: str, arguments: list[Node]) -> Node:
    return lambda device: _call(target(device), name, [argument(device) for argument in arguments])


def _truth(node: Callable[[Mapping[str, Any]], Any], device: Mapping[str, Any]) -> bool:
    value = node(device)
    if not isinstance(value, bool):
        raise CelError(f"expected a boolean, got {value!r}")
    return value


def _index(value: Any, key: Any) -> Any:
    if not isinstance(value, Mapping):
        raise CelError(f"cannot select {key!r} of {value!r}")
    if key not in value:
        raise Missing(key)
    return value[key]


def _call(target: Any, method: str, arguments: list[Any]) -> Any:
    if isinstance(target, Quantity) and method == "compareTo":
        return target.compareTo(*arguments)
    if isinstance(target, str):
        if method == "lowerAscii" and not arguments:
            return target.lower()
        if method in ("contains", "startsWith", "endsWith"):
            name = {"contains": "__contains__", "startsWith": "startswith", "endsWith": "endswith"}[method]
            return bool(getattr(target, name)(*arguments))
    raise CelError(f"unsupported call {method}() on {target!r}")


def compile_selector(expression: str) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over a device view (:func:`device_view`); raises :class:`CelError` when the
    expression is outside the subset."""
    node = _Parser(expression).parse()

    def matches(device: Mapping[str, Any]) -> bool:
        try:
            return _truth(node, device)
        except Missing:
            return False

    return matches


def device_view(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice device as CEL sees it: attributes and capacities by domain (an unqualified
    name is in the driver's domain), attribute values typed, capacities as quantities."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, short = name.rpartition("/")
        typed = next(value[kind] for kind in ("string", "int", "bool", "version") if kind in value)
        attributes.setdefault(domain or driver, {})[short] = typed
    capacity: dict[str, dict[str, Quantity]] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[short] = Quantity.parse(str(value["value"]))
    return {"driver": driver, "attributes": attributes, "capacity": capacity}
