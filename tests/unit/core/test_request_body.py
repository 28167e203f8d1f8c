"""Every door reads a request only within limits (issues 11 and 20): pure, no server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.core.errors import RequestBodyError
from jupyter_gpushare.core.request_body import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_NESTING,
    check_headers,
    check_kernel_id,
    check_label,
    json_object,
    json_value,
    nesting_depth,
)


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"{}", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[{{{{"}', 1),  # brackets inside strings do not count
        (b'{"a": "\\"[["}', 1),  # nor after an escaped quote
        (b"1", 0),
    ],
)
def test_nesting_is_counted_without_parsing(raw: bytes, depth: int) -> None:
    assert nesting_depth(raw) == depth


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"[" * 3000 + b"]" * 3000, "nests deeper than 32"),
        (b'{"a": ' + b"[" * 33 + b"]" * 33 + b"}", "nests deeper than 32"),
        (b'{"path": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"\\udfff": 1}', "lone UTF-16 surrogate"),  # keys too
        (b"\xff\xfe{", "not valid JSON"),
        (b'{"a": NaN}', "not valid JSON"),
        (b"{", "not valid JSON"),
    ],
)
def test_a_body_beyond_a_limit_is_a_400_that_names_it(raw: bytes, words: str) -> None:
    with pytest.raises(RequestBodyError) as caught:
        json_value(raw)
    assert words in str(caught.value) and caught.value.status == 400


def test_a_body_too_large_is_a_413_before_anything_is_parsed() -> None:
    with pytest.raises(RequestBodyError) as caught:
        json_value(b"[" * (MAX_BODY_BYTES + 1))
    assert caught.value.status == 413 and "at most 65536 bytes" in str(caught.value)


def test_headers_beyond_their_limit_are_a_431() -> None:
    check_headers("GET /api/gpushare/broker/info HTTP/1.1", [("Authorization", "token " + "t" * 64)])
    with pytest.raises(RequestBodyError) as caught:
        check_headers("GET / HTTP/1.1", [("X-Filler", "x" * MAX_HEADER_BYTES)])
    assert caught.value.status == 431 and f"at most {MAX_HEADER_BYTES} bytes" in str(caught.value)


@pytest.mark.parametrize(
    "value",
    [
        "esc\x1b]0;owned\x07\x1b[2J",
        "nul\x00",
        "../../etc/passwd",
        "process-123",
        "0b5ad5ec-9c1e-4a4f-8d0e-3d2b6a1c7f00\n",
        "0b5ad5ec9c1e4a4f8d0e3d2b6a1c7f00",
        "{0b5ad5ec-9c1e-4a4f-8d0e-3d2b6a1c7f00}",
        42,
        None,
    ],
)
def test_a_kernel_id_is_a_uuid_or_refused_without_echoing_control_characters(value: object) -> None:
    with pytest.raises(RequestBodyError) as caught:
        check_kernel_id(value)
    message = str(caught.value)
    assert "must be a kernel id (a UUID" in message and "\x1b" not in message and "\x00" not in message


def test_jupyter_clients_kernel_ids_pass() -> None:
    for kernel_id in ("0b5ad5ec-9c1e-4a4f-8d0e-3d2b6a1c7f00", "0B5AD5EC-9C1E-4A4F-8D0E-3D2B6A1C7F00"):
        assert check_kernel_id(kernel_id) == kernel_id


def test_an_empty_body_is_an_empty_object_and_an_array_is_not_an_object() -> None:
    assert json_object(b"") == {} == json_object(b"  ")
    with pytest.raises(RequestBodyError, match="must be a JSON object"):
        json_object(b"[]")
    assert json_value(b'{"a": [' + b"[" * (MAX_NESTING - 2) + b"]" * (MAX_NESTING - 2) + b"]}")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (42, "must be a string"),
        ("a\x00b", "control characters"),
        ("a\nb", "control characters"),
        ("a\x1b[31m", "control characters"),
        ("x" * 4097, "at most 4096 bytes"),
        ("é" * 2049, "4098 bytes long"),
    ],
)
def test_a_path_is_short_and_without_control_characters(value: object, words: str) -> None:
    with pytest.raises(RequestBodyError, match=words):
        check_label("path", value, 4096)


def test_ordinary_paths_pass() -> None:
    for path in ("work/x.ipynb", "Ünïcode/ノート.ipynb", "a b/c-d_e.ipynb", "x" * 4096):
        assert check_label("path", path, 4096) == path


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=30,
    )
)
def test_any_json_value_is_read_back_or_refused_with_a_4xx(value: object) -> None:
    raw = json.dumps(value).encode()
    try:
        assert json_value(raw) == value or raw.strip() == b""
    except RequestBodyError as error:
        assert error.status in (400, 413)
