"""The usage report and its series (pure): sums by user, group and kernel; bad input refused."""

from __future__ import annotations

import csv
import io

import pytest

from jupyter_gpushare.core.accounting.tally import DETAIL_SECONDS, ROLLED_SECONDS, TEST_KERNEL_NAME, Figures
from jupyter_gpushare.core.accounting.usage_report import (
    ROLLED_TESTS,
    Bucket,
    KernelInfo,
    ReportError,
    as_csv,
    as_table,
    check_by,
    local_time,
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
            kernels={
                "k1": KernelInfo("a.ipynb", "python3-gpu", T0),
                "k2": KernelInfo("b.ipynb", "python3-gpu"),
            },
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
        "k2": ("bob: k2 b.ipynb", 2.0),
        "k1": ("alice: k1 a.ipynb", 2.0),
        "bob/(older kernels)": ("bob: (older kernels)", 1.0),
    }


ALICE_KERNELS = [f"{n}1f0c3a2-7d4e-4b6a-9c1d-2e3f4a5b6c7d" for n in range(5)]


def test_each_kernel_row_tells_its_kernel_apart_without_a_notebook() -> None:
    """Five kernels of one kernelspec started outside JupyterLab: before, five identical rows
    ``nc-alice: python3-gpu`` with nothing to tell them apart."""
    buckets = [bucket(i * 60, kernel, "nc-alice", 60) for i, kernel in enumerate(ALICE_KERNELS)]
    kernels = {kernel: KernelInfo("", "python3-gpu", T0 + i * 60) for i, kernel in enumerate(ALICE_KERNELS)}
    kernels[ALICE_KERNELS[0]] = KernelInfo("work/a.ipynb", "python3-gpu", T0)
    payload = report(
        buckets, since=T0 - HOUR, until=T0 + HOUR, by="kernel", scope="everyone", kernels=kernels, groups={}
    )
    labels = [entry["label"] for entry in payload["rows"]]
    assert len(set(labels)) == 5
    first, second = (next(e for e in payload["rows"] if e["key"] == ALICE_KERNELS[i]) for i in (0, 1))
    assert first["label"] == f"nc-alice: {ALICE_KERNELS[0][:8]} work/a.ipynb"
    assert second["label"] == f"nc-alice: {ALICE_KERNELS[1][:8]} no notebook (python3-gpu)"
    assert (second["owner"], second["notebook"], second["kernelspec"]) == ("nc-alice", None, "python3-gpu")
    assert second["started"] == "1970-02-11T16:01:00Z"  # T0 + 60 s, ISO 8601 in UTC
    assert payload["total"]["owner"] is None and payload["total"]["started"] is None
    table = as_table(payload).splitlines()
    assert table[0].split()[:5] == ["kernel", "owner", "started", "notebook", "reserved"]
    line = next(text for text in table if text.startswith(ALICE_KERNELS[1][:8]))
    assert line.split()[1] == "nc-alice"
    assert local_time(second["started"]) in line and "no notebook (python3-gpu)" in line


def test_the_doctors_test_kernels_are_summed_apart_from_users_figures() -> None:
    buckets = [
        *BUCKETS,
        bucket(0, "doctor-1", "alice", 30, starts=1),
        Bucket(T0 - 5 * HOUR, ROLLED_SECONDS, ROLLED_TESTS, "bob", Figures(reserved=10 * GiB, starts=1)),
    ]
    kernels = {"k1": KernelInfo("a.ipynb"), "doctor-1": KernelInfo("", TEST_KERNEL_NAME, T0)}
    for by in ("user", "group", "kernel"):
        payload = report(
            buckets,
            since=T0 - 10 * HOUR,
            until=T0 + HOUR,
            by=by,
            scope="everyone",
            kernels=kernels,
            groups={},
        )
        assert "doctor-1" not in {entry["key"] for entry in payload["rows"]}
        assert payload["total"]["reserved_gib_hours"] == 5.0  # as without them
        assert payload["total"]["starts"] == 3 and payload["total"]["kernels"] == 2
        assert sum(sum(user["reserved"]) for user in payload["series"]["users"]) == sum(
            sum(user["reserved"]) for user in make(by)["series"]["users"]
        )
        tests = payload["test_kernels"]
        assert (tests["kernels"], tests["starts"]) == (1, 2)
        assert tests["reserved_gib_hours"] == pytest.approx((30 + 10) / 3600)
        assert (
            "Not in the figures above: the test kernels of jupyter gpushare doctor, 2 start(s)"
            in as_table(payload)
        )
    assert "test kernel" not in as_table(make("user"))


def test_since_and_until_are_iso_8601() -> None:
    payload = make("user", since=T0)
    assert (payload["since"], payload["until"]) == ("1970-02-11T16:00:00Z", "1970-02-11T18:00:00Z")


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
    assert table[2].startswith("bob") and table[5].startswith("total")
    # What the counts mean: starts are slices placed, so a kernel can count several.
    assert table[-1].startswith("kernels: how many kernels held a slice; starts: slices placed")
    rows = list(csv.DictReader(io.StringIO(as_csv(payload))))
    assert [row["key"] for row in rows] == ["bob", "alice", "total"]
    assert float(rows[0]["reserved_gib_hours"]) == 3.0
