"""Which clients get a gzip body, and the compressed body made once per rendering."""

from __future__ import annotations

import gzip
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from jupyter_gpushare.server.content_coding import GZIP_MIN_BYTES, accepts_gzip, compressed
from jupyter_gpushare.server.snapshots import Body


@pytest.mark.parametrize(
    "header",
    ["gzip", "GZIP", "gzip, deflate, br", "br;q=1.0, gzip;q=0.5", "*", "deflate, *;q=0.1", "x-gzip"],
)
def test_a_client_that_lists_gzip_or_anything_gets_it(header: str) -> None:
    assert accepts_gzip(header)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "identity",
        "br, deflate",
        "gzip;q=0",
        "gzip;q=0.000, identity",
        "*;q=0",
        "*, gzip;q=0",  # gzip refused by name, whatever the wildcard allows
        "gzip;q=high",  # a weight nobody can read: not taken as a yes
        "gzip;q=2",
        ",,;",
    ],
)
def test_a_client_that_does_not_list_gzip_or_refuses_it_gets_plain_bytes(header: str | None) -> None:
    assert not accepts_gzip(header)


def test_a_small_body_is_not_compressed_and_a_large_one_round_trips_the_same_each_time() -> None:
    assert compressed(b"x" * (GZIP_MIN_BYTES - 1)) is None
    data = json.dumps([{"kernel_id": f"k{index}", "state": "running"} for index in range(400)]).encode()
    packed = compressed(data)
    assert packed is not None and gzip.decompress(packed) == data and len(packed) < len(data) // 4
    assert compressed(data) == packed  # no timestamp inside: the same ETag for the same list


def test_a_body_is_compressed_once_with_an_etag_of_its_own() -> None:
    body = Body.of([{"kernel_id": f"k{index}", "path": "work/a.ipynb"} for index in range(200)])
    assert not body.gzip_ready
    with ThreadPoolExecutor(8) as pool:  # requests arriving together share one compression
        answers = list(pool.map(lambda _: body.gzipped(), range(8)))
    gzipped = answers[0]
    assert gzipped is not None and all(answer is gzipped for answer in answers) and body.gzip_ready
    data, etag = gzipped
    assert gzip.decompress(data) == body.data
    assert etag == f'"{hashlib.sha1(data).hexdigest()}"' != body.etag
    small = Body.of({"devices": []})
    assert small.gzipped() is None and small.gzip_ready
    assert small == Body.of({"devices": []})  # equal bodies stay equal, compressed or not
