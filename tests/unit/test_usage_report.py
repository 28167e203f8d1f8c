"""The usage report and its series (pure): sums by user, group and kernel; bad input refused."""

from __future__ import annotations

import csv
import io

import pytest

from jupyter_gpushare.tally import DETAIL_SECONDS, ROLLED_SECONDS, Figures
from jupyter_gpushare.usage_report import (
    Bucket,
    ReportError,
    as_csv,
    as_table,
    check_by,
    parse_since,
    report,
    series_step,
    usage_query,
)

GiB = 2**30
HOUR = 3600.0
T0 = 1_000 * ROLLED_SECONDS


def bucket(offset: float, kernel: str, owner: str, reserved_gib_s: float, **more: float) -> Bucket:
    return Bucket(T0 + offset, DETAIL_SECONDS, kernel, owner, Figures(reserved=reserved_gib_s * GiB, **more))


BUCKETS = [
    bucket(0, "k1", "alice", 3600, used=1800 * GiB, busy=600, idle=300, starts=1, wait=30),
    bucket(900, "k1", "alice", 3600, idle=900),
    bucket(0, "k2", "bob", 7200, starts=2, wait=0, suspends=1),
    Bucket(T0 - 5 * HOUR, ROLLED_SECONDS, "", "bob", Figures(reserved=3600 * GiB)),
]


def make(by: str, since: float = T0 - 10 * HOUR) -> dict:
    return dict(
        report(
            BUCKETS,
            since=since,
            until=T0 + 2 * HOUR,
            by=by,
            scope="everyone",
            labels={"k1": "a.ipynb", "k2": "b.ipynb"},
            groups={"alice": ["ml", "vision"], "bob": ["ml"]},
        )
    )


def test_by_user_sums_each_users_buckets_heaviest_first_with_a_total() -> None:
    payload = make("user")
    assert [(r["key"], r["reserved_gib_hours"]) for r in payload["rows"]] == [("bob", 3.0), ("alice", 2.0)]
    alice = payload["rows"][1]
    assert alice["used_gib_hours"] == 0.5
    assert alice["used_share"] == 0.25
    assert alice["busy_hours"] == pytest.approx(600 / HOUR)
    assert alice["mean_start_wait_seconds"] == 30
    assert alice["kernels"] == 1
    assert payload["total"]["reserved_gib_hours"] == 5.0
    assert payload["total"]["kernels"] == 2


def test_by_group_counts_a_user_in_each_of_their_groups() -> None:
    rows = {r["key"]: r["reserved_gib_hours"] for r in make("group")["rows"]}
    assert rows == {"ml": 5.0, "vision": 2.0}


def test_by_kernel_labels_kernels_and_keeps_rolled_up_hours_apart() -> None:
    rows = {r["key"]: (r["label"], r["reserved_gib_hours"]) for r in make("kernel")["rows"]}
    assert rows == {
        "k2": ("bob: b.ipynb", 2.0),
        "k1": ("alice: a.ipynb", 2.0),
        "bob/(older kernels)": ("bob: (older kernels)", 1.0),
    }


def test_since_leaves_older_buckets_out() -> None:
    assert make("user", since=T0 - HOUR)["total"]["reserved_gib_hours"] == 4.0


def test_the_series_is_each_users_mean_reserved_and_used_bytes_per_step() -> None:
    payload = make("user", since=T0)
    series = payload["series"]
    assert series["step"] == DETAIL_SECONDS
    alice = next(s for s in series["users"] if s["user"] == "alice")
    assert alice["reserved"][:2] == [4 * GiB, 4 * GiB]
    assert alice["used"][0] == 2 * GiB


def test_series_steps_are_whole_buckets_and_hours_where_the_range_reaches_rolled_up_ones() -> None:
    assert series_step(0, 86400) == DETAIL_SECONDS
    assert series_step(0, 7 * 86400) == 7 * DETAIL_SECONDS  # 96 points of 1 h 45 min
    assert series_step(0, 86400, rolled_before=3600) % ROLLED_SECONDS == 0


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 7 * 86400), ("24h", 86400), ("90m", 5400), ("2w", 14 * 86400), (" 30s ", 30)]
)
def test_since_takes_durations(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d7", "7y", "-1d", "0h", "1e3d", "99999d", "7 days"])
def test_a_bad_since_is_one_sentence(text: str) -> None:
    with pytest.raises(ReportError, match=r"^since must be"):
        parse_since(text)


def test_bad_by_and_repeated_parameters_are_refused() -> None:
    with pytest.raises(ReportError, match="by must be one of user, group, kernel, not 'team'"):
        check_by("team")
    with pytest.raises(ReportError, match="since may be given once, not 2 times"):
        usage_query(lambda name: ["1d", "2d"] if name == "since" else [])
    assert usage_query(lambda name: []) == (7 * 86400, "user")


def test_table_and_csv_carry_every_row_and_the_total() -> None:
    payload = make("user")
    table = as_table(payload).splitlines()
    assert table[0].split()[:3] == ["user", "reserved", "GiB·h"]
    assert table[2].startswith("bob") and table[-1].startswith("total")
    rows = list(csv.DictReader(io.StringIO(as_csv(payload))))
    assert [row["key"] for row in rows] == ["bob", "alice", "total"]
    assert float(rows[0]["reserved_gib_hours"]) == 3.0
