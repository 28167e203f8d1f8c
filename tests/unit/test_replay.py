"""The replay benchmark's parts: the trace format and its readers, the idle policy's holds, and a
small replay whose outcome is known by hand (the benchmark's figures rest on these)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from replay import Hold, Way, mae, main, needed, plan, replay  # noqa: E402
from replay_trace import SHAPES, Session, Trace, busy_share, dump, generate, load, read_openb  # noqa: E402

GiB = 2**30


def session(start: float, end: float, memory: str, cells: tuple[tuple[float, float], ...] | None) -> Session:
    return Session(f"s{start:g}", "alice", start, end, memory, cells)


def test_the_idle_policy_cuts_a_session_into_holds() -> None:
    cells = ((30.0, 10.0), (50.0, 20.0), (1000.0, 5.0))  # idle 930 s between the 2nd and 3rd
    holds = plan(0, session(0, 2000, "8G", cells), suspend_after=600)
    assert holds == [
        Hold(0, 0, 0.0, 70.0 + 600, 30.0, False),  # from the start, suspended 10 min after 70 s
        Hold(0, 1, 1000.0, 1005.0 + 600 - 1000, 5.0, True),  # the next cell resumes it
    ]
    # Without suspension (or without cells) the session holds its slice throughout.
    assert plan(0, session(0, 2000, "8G", cells), None) == [Hold(0, 0, 0.0, 2000.0, 35.0, False)]
    assert plan(0, session(0, 500, "8G", None), 600)[0].busy == 500


def test_a_replay_waits_as_the_queue_would() -> None:
    trace = Trace(
        "by hand",
        (
            session(0, 100, "60G", ((0.0, 100.0),)),
            session(10, 50, "40G", ((10.0, 40.0),)),  # does not fit next to 60G: waits until 100
        ),
    )
    plans = [plan(n, s, None) for n, s in enumerate(trace.sessions)]
    result = replay(trace, plans, 1, "A100-80GB", Way("fifo"))
    assert sorted(result.waits) == [0.0, 90.0]
    assert result.reserved == 60 * GiB * 100 + 40 * GiB * 40  # the second shifts by its wait
    whole = replay(
        trace,
        [plan(n, s, None) for n, s in enumerate(trace.sessions)],
        2,
        "A100-80GB",
        Way("w", whole_card=True),
    )
    assert whole.waits == [0.0, 0.0] and whole.reserved == 80 * GiB * 140


def test_a_trace_survives_its_file_and_bad_files_say_why(tmp_path: Path) -> None:
    trace = generate(seed=2, days=1, users=3)
    dump(trace, tmp_path / "trace.json")
    again = load(tmp_path / "trace.json")
    assert len(again.sessions) == len(trace.sessions) and again.sessions[0].user == trace.sessions[0].user
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="is not a trace of format 'gpushare-trace/1'"):
        load(tmp_path / "bad.json")


def test_a_generated_week_is_busy_about_a_third_of_its_working_time() -> None:
    week = generate(seed=1)
    assert 0.28 < busy_share(week.sessions) < 0.40
    lengths = sorted(s.end - s.start for s in week.sessions)
    assert lengths[len(lengths) // 2] < 3600 < lengths[-1] / 24  # heavy-tailed: some last days


def test_openb_pods_become_sessions_without_cells(tmp_path: Path) -> None:
    csv = tmp_path / "openb_pod_list_sample.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "pod-a,8000,30000,1,500,,LS,Succeeded,100,700,101\n"
        "pod-b,4000,1000,0,0,,BE,Succeeded,120,500,121\n"  # no GPU: left out
        "pod-c,8000,60000,2,1000,V100M32,LS,Running,150,,151\n"  # two GPUs: counted, left out
        "pod-d,8000,60000,1,1000,,LS,Running,200,,201\n"  # still running: until the trace's end
    )
    trace = read_openb(csv)
    assert trace.skipped == 1
    assert [(s.id, s.start, s.end, s.memory, s.cells) for s in trace.sessions] == [
        ("pod-a", 0.0, 600.0, "40960M", None),
        ("pod-d", 100.0, 600.0, "whole", None),
    ]


def test_the_search_finds_the_fewest_cards_that_meet_the_goal() -> None:
    trace = generate(seed=3, days=1, users=25, shape=SHAPES["bursts"])
    for way in (Way("whole", whole_card=True), Way("fifo"), Way("fair", "fair", 600.0)):
        plans = [plan(n, s, way.suspend_after) for n, s in enumerate(trace.sessions)]
        found = needed(trace, plans, "A100-80GB", way)
        assert replay(trace, plans, found.cards, "A100-80GB", way).meets()
        # Every smaller pool misses the goal, replayed to the end (not given up on).
        for cards in range(1, found.cards):
            short = replay(trace, plans, cards, "A100-80GB", way)
            assert not short.meets(), (way, cards, found.cards)


OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def test_slices_never_need_more_cards_than_whole_cards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 95 whole-card pods one after another, then five half-card pods at once: the most memory
    # held at once is 2.5 cards, but 5% of the starts may wait, so one card meets the goal
    # either way (slices searched from that peak needed three cards, whole cards one).
    rows = [
        f"seq-{i},1000,1000,1,1000,,LS,Succeeded,{i * 1000},{i * 1000 + 900},{i * 1000}" for i in range(95)
    ]
    rows += [
        f"burst-{i},1000,1000,1,500,,LS,Succeeded,{100_000 + i},{110_000 + i},{100_000 + i}" for i in range(5)
    ]
    csv = tmp_path / "openb_pod_list_burst.csv"
    csv.write_text("\n".join([OPENB_HEADER, *rows]) + "\n")
    assert main(["--trace", str(csv)]) == 0
    matches = (
        re.match(r"((?:whole card|gpushare|bound).*?)\s{2,}(\d+)\s", line)
        for line in capsys.readouterr().out.splitlines()
    )
    gpus: dict[str, int] = {}
    for match in matches:  # the first table's (the cards each way needs)
        if match:
            gpus.setdefault(match[1], int(match[2]))
    assert gpus["whole card (device plugin)"] == 1
    assert gpus["gpushare fifo, no suspend"] == gpus["gpushare fair, no suspend"] == 1
    assert gpus["bound (memory only while cells run)"] == 1


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_wait_estimate_is_no_worse_than_the_naive_one(shape: str) -> None:
    trace = generate(seed=5, days=2, users=min(30, SHAPES[shape].users), shape=SHAPES[shape])
    way = Way("fifo", suspend_after=600.0)
    plans = [plan(n, s, way.suspend_after) for n, s in enumerate(trace.sessions)]
    found = needed(trace, plans, "A100-80GB", way)
    tight = replay(trace, plans, max(1, found.cards - 1), "A100-80GB", way, estimate=True)
    assert len(tight.errors) >= 20, "too few waits to compare"
    assert mae(tight.errors) <= mae(tight.naive)


def test_a_pod_list_without_times_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "openb_pod_list_multigpu20.csv"
    csv.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,12000,16384,1,1000\n")
    with pytest.raises(ValueError, match="has no creation_time, deletion_time column: not a list of when"):
        read_openb(csv)
    with pytest.raises(SystemExit) as exit_:
        main(["--trace", str(csv)])
    assert exit_.value.code == 2
    assert "has no creation_time, deletion_time column" in capsys.readouterr().err
