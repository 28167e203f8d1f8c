"""The REST edge reads a body only within limits (issue 11): pure, no server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.errors import RequestBodyError
from jupyter_gpushare.server.request_body import (
    MAX_BODY_BYTES,
    MAX_NESTING,
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
        (b" " * (MAX_BODY_BYTES + 1), "at most 65536 bytes"),
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
def test_any_json_value_is_read_back_or_refused_with_a_400(value: object) -> None:
    raw = json.dumps(value).encode()
    try:
        assert json_value(raw) == value or raw.strip() == b""
    except RequestBodyError as error:
        assert error.status == 400
