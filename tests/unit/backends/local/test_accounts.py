"""The accounting in a real node ledger: the triggers record every change of a slice, the fold
turns them into figures, old figures are rolled up, and fair share orders the queue by them."""

from __future__ import annotations

import datetime
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from jupyter_gpushare.backends.accounting import store
from jupyter_gpushare.backends.local.accounts import LedgerAccounts, show_idle
from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.accounting.tally import DETAIL_SECONDS, ROLLED_SECONDS, TEST_KERNEL_NAME, Figures
from jupyter_gpushare.core.accounting.usage_report import ROLLED_TESTS, report
from jupyter_gpushare.core.payloads import KernelPayload
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.placement.queue_order import QueueRule
from jupyter_gpushare.core.placement.wait_estimate import MIN_HISTORY
from jupyter_gpushare.core.records import NewRequest, Placed, SuspendedState, Waiting
from jupyter_gpushare.core.visibility import EVERYONE

GiB = 2**30
POOL = parse_simulation("1xA100-80GB")
CARD = POOL.devices[0]
ME = current_process()
FAIR = Policy(queue=QueueRule("fair", half_life=3600.0, age_bound=120.0))


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_devices(POOL.devices, simulated=True)
    yield ledger
    ledger.close()


@pytest.fixture
def accounts(ledger: Ledger) -> LedgerAccounts:
    return LedgerAccounts(ledger, lambda: GPUShare())


def request(
    kernel_id: str, size: str, owner: str = "alice", name: str = "python3", path: str | None = None
) -> NewRequest:
    notebook = f"{kernel_id}.ipynb" if path is None else path
    return NewRequest(kernel_id, owner, "server-1", "timeslice", "shared", size, None, ME, name, notebook)


def events(ledger: Ledger) -> list[tuple[str, str, int | None, int | None]]:
    rows = ledger.read_with(lambda db: db.execute("SELECT * FROM acct_events ORDER BY id").fetchall())
    return [(row["kernel_id"], row["what"], row["memory"], row["used"]) for row in rows]


def test_every_change_of_a_slice_is_recorded_in_its_own_transaction(ledger: Ledger) -> None:
    assert isinstance(ledger.request(request("k1", "4G"), Policy()), Placed)
    ledger.resize("k1", "8G", Policy())
    ledger.report_usage("k1", 3 * GiB, None, "simulated")
    ledger.report_usage("k1", 3 * GiB, 50, "simulated")  # the same use: nothing to record
    state = SuspendedState("8G", "timeslice", "shared", None, 8 * GiB, CARD.uuid, CARD.name, 0, 0.0, ME)
    ledger.release("k1", keep_claim=True, suspended=state)
    ledger.enqueue(request("k1", "8G"))  # the resume asks again
    ledger.release("k1")
    assert events(ledger) == [
        ("k1", "placed", 4 * GiB, None),  # a request queued is not recorded: its placement is
        ("k1", "resized", 8 * GiB, None),
        ("k1", "used", None, 3 * GiB),
        ("k1", "ended", 8 * GiB, None),
        ("k1", "suspended", None, None),
        ("k1", "unsuspended", None, None),
        ("k1", "withdrawn", 0, None),
    ]
    times = ledger.read_with(lambda db: db.execute("SELECT requested_at FROM acct_events").fetchall())
    assert times[0][0] is not None and times[-1][0] is not None  # the placement and the withdrawal


def test_a_folded_session_is_what_was_held_and_used(ledger: Ledger, accounts: LedgerAccounts) -> None:
    started = time.time()
    ledger.request(request("k1", "4G"), Policy())
    ledger.report_usage("k1", GiB, None, "simulated")
    time.sleep(0.3)
    accounts.note_activity("k1", True, time.time(), 3600, "suspend")
    time.sleep(0.2)
    accounts.note_activity("k1", False, time.time(), 3600, "suspend")
    ledger.release("k1")
    held = time.time() - started
    assert accounts.fold() > 0
    assert accounts.fold() == 0  # nothing new: nothing written
    report = accounts.report(3600, "user", "alice")
    alice = report["rows"][0]
    assert alice["key"] == "alice"
    assert alice["reserved_gib_hours"] * 3600 == pytest.approx(4 * held, abs=4 * 0.05)
    assert alice["used_gib_hours"] * 3600 == pytest.approx(held, abs=0.05)
    assert alice["busy_hours"] * 3600 == pytest.approx(0.2, abs=0.05)
    assert (alice["busy_hours"] + alice["idle_hours"]) * 3600 == pytest.approx(held, abs=0.05)
    assert alice["starts"] == 1
    # Another user sees none of it; an admin sees it.
    assert accounts.report(3600, "user", "bob")["rows"] == []
    assert [row["key"] for row in accounts.report(3600, "user", EVERYONE)["rows"]] == ["alice"]
    # The all-time totals (the Prometheus counters) say the same.
    assert accounts.totals("alice")["alice"].reserved / GiB / 3600 == pytest.approx(
        alice["reserved_gib_hours"]
    )


def test_the_wait_estimates_know_when_each_finished_hold_ended(
    ledger: Ledger, accounts: LedgerAccounts
) -> None:
    ledger.request(request("k1", "4G"), Policy())
    time.sleep(0.1)
    ledger.release("k1")
    ended = time.time()
    accounts.fold()
    history = accounts.history()
    assert history.holds[0][0] == 4 * GiB and history.holds[0][1] == pytest.approx(0.1, abs=0.1)
    assert len(history.ended_at) == 1 and history.ended_at[0] == pytest.approx(ended, abs=0.5)


def kept_estimates(ledger: Ledger) -> dict[str, tuple[float, float]]:
    rows = ledger.read_with(lambda db: db.execute("SELECT * FROM acct_estimates").fetchall())
    return {row["kernel_id"]: (row["model"], row["naive"]) for row in rows}


def test_a_waiting_starts_estimates_are_kept_until_it_is_placed_then_judged(
    ledger: Ledger, accounts: LedgerAccounts
) -> None:
    """Failed before: nothing of a start's estimates was kept, so the estimate could judge its
    model only on past holds, never on the waits it told."""
    for number in range(MIN_HISTORY):
        ledger.request(request(f"done{number}", "8G"), Policy())
        ledger.release(f"done{number}")
    accounts.fold()
    ledger.request(request("blocker", "80G", owner="bob"), Policy())
    assert isinstance(ledger.request(request("k1", "8G"), Policy()), Waiting)
    assert isinstance(ledger.request(request("k2", "8G"), Policy()), Waiting)

    def describe() -> list[KernelPayload]:
        records = ledger.records()
        views = [cast(KernelPayload, {"kernel_id": r.kernel_id, "state": r.state}) for r in records]
        accounts.describe(views, records, POOL.devices, Policy())
        return views

    views = describe()
    assert all(view["expected_start"] is not None for view in views if view["state"] == "queued")
    kept = kept_estimates(ledger)
    assert set(kept) == {"k1", "k2"}
    time.sleep(0.05)
    describe()
    assert kept_estimates(ledger) == kept  # the first estimates stay
    ledger.withdraw_waiting(["k2"])
    ledger.release("blocker")
    assert isinstance(ledger.try_place("k1", Policy()), Placed)
    placed_at = time.time()
    assert kept_estimates(ledger) == {}  # one placed, one withdrawn: nothing left waiting
    [judged] = accounts.history().judged
    assert (judged.model, judged.naive) == kept["k1"]
    assert judged.placed_at == pytest.approx(placed_at, abs=0.5)


def test_a_running_slice_counts_up_to_now_without_a_fold(ledger: Ledger, accounts: LedgerAccounts) -> None:
    ledger.request(request("k1", "2G"), Policy())
    accounts.fold()
    time.sleep(0.2)
    first = accounts.totals("alice")["alice"].reserved
    time.sleep(0.2)
    assert accounts.totals("alice")["alice"].reserved > first > 0  # monotonic: a counter


def test_old_figures_roll_up_by_user_and_hour_and_totals_stay(ledger: Ledger) -> None:
    now = 1_000_000 * ROLLED_SECONDS
    old = now - 10 * 86400

    def write(db: sqlite3.Connection) -> None:
        for i, kernel in enumerate(("k1", "k2", "k1")):
            store._add_buckets(
                db, {(old + i * DETAIL_SECONDS, kernel, "alice"): Figures(reserved=GiB * 900)}, DETAIL_SECONDS
            )
        store.roll_up(db, now, store.Keeping(retention=7 * 86400, history=400 * 86400))

    ledger.write_with(write)
    rows = ledger.read_with(
        lambda db: db.execute("SELECT start, width, kernel_id, owner, reserved FROM acct_usage").fetchall()
    )
    assert [tuple(row) for row in rows] == [(old, ROLLED_SECONDS, "", "alice", 3 * GiB * 900.0)]
    ledger.write_with(lambda db: store.roll_up(db, now + 500 * 86400, store.Keeping(history=400 * 86400)))
    assert ledger.read_with(lambda db: db.execute("SELECT COUNT(*) FROM acct_usage").fetchone()[0]) == 0


def test_a_kernel_row_names_the_kernelspec_and_start_of_a_kernel_without_a_notebook(
    ledger: Ledger, accounts: LedgerAccounts
) -> None:
    before = time.time()
    ledger.request(request("k1", "2G", name="python3-gpu", path=""), Policy())
    ledger.request(request("k2", "2G", name="python3-gpu", path=""), Policy())
    after = time.time()
    rows = {row["key"]: row for row in accounts.report(3600, "kernel", EVERYONE)["rows"]}
    assert rows["k1"]["label"] == "alice: k1 no notebook (python3-gpu)"
    assert (rows["k1"]["notebook"], rows["k1"]["kernelspec"]) == (None, "python3-gpu")
    started = datetime.datetime.fromisoformat(rows["k1"]["started"].replace("Z", "+00:00")).timestamp()
    assert int(before) <= started <= after
    ledger.release("k1")
    ledger.request(request("k1", "2G", name="python3-gpu", path=""), Policy())  # asked again
    again = accounts.report(3600, "kernel", EVERYONE)["rows"]
    assert {row["key"]: row["started"] for row in again}["k1"] == rows["k1"]["started"]
    assert {row["key"]: row["starts"] for row in again}["k1"] == 2


def test_a_starts_wait_in_the_queue_is_accounted(ledger: Ledger, accounts: LedgerAccounts) -> None:
    """The placement's event carries when the request was made. Failed before: the fold never
    read it, and every wait counted 0."""
    ledger.request(request("blocker", "80G", owner="bob"), Policy())
    assert isinstance(ledger.request(request("k1", "8G"), Policy()), Waiting)
    time.sleep(0.5)
    ledger.release("blocker")
    assert isinstance(ledger.try_place("k1", Policy()), Placed)
    [alice] = accounts.report(3600, "user", "alice")["rows"]
    assert alice["mean_start_wait_seconds"] >= 0.5
    assert alice["queue_wait_hours"] * 3600 == pytest.approx(alice["mean_start_wait_seconds"], abs=0.01)


def test_the_doctors_test_kernel_is_held_but_kept_out_of_users_figures(
    ledger: Ledger, accounts: LedgerAccounts
) -> None:
    ledger.request(request("k1", "4G"), Policy())
    ledger.request(request("doctor", "512M", name=TEST_KERNEL_NAME, path=""), FAIR)
    assert ledger.held()  # it holds its slice like any kernel
    time.sleep(0.1)
    ledger.release("doctor")
    for by in ("user", "kernel"):
        payload = accounts.report(3600, by, EVERYONE)
        assert payload["total"]["starts"] == 1 and payload["total"]["kernels"] == 1, by
        assert "doctor" not in {row["key"] for row in payload["rows"]}
        assert (payload["test_kernels"]["kernels"], payload["test_kernels"]["starts"]) == (1, 1)
    assert accounts.totals(EVERYONE)["alice"].starts == 1  # the counters too
    # Fair share still counts what it held: nobody gets a slice for free by its name.
    assert ledger.read_with(lambda db: store.recent(db, time.time(), 3600))["alice"] > 0


def test_the_doctors_test_kernels_roll_up_apart_from_their_owners(ledger: Ledger) -> None:
    ledger.request(request("doctor", "512M", name=TEST_KERNEL_NAME, path=""), Policy())
    ledger.release("doctor")
    LedgerAccounts(ledger, lambda: GPUShare()).fold()
    now = time.time() + 10 * 86400
    ledger.write_with(lambda db: store.roll_up(db, now, store.Keeping(retention=7 * 86400)))
    rows = ledger.read_with(
        lambda db: db.execute("SELECT kernel_id, owner, starts FROM acct_usage").fetchall()
    )
    assert [tuple(row) for row in rows] == [(ROLLED_TESTS, "alice", 1)]
    buckets, kernels = ledger.read_with(lambda db: store.buckets(db, now - 30 * 86400, now))
    payload = report(
        buckets, since=now - 30 * 86400, until=now, by="user", scope="everyone", kernels=kernels, groups={}
    )
    assert payload["rows"] == [] and payload["test_kernels"]["starts"] == 1


def test_a_ledger_of_the_earlier_accounting_is_brought_up_to_date(tmp_path: Path) -> None:
    """A file whose accounting tables name the notebook ``label`` and know no kernelspec (and
    whose triggers write them so) gets the new columns and triggers when it is opened again."""
    path = tmp_path / "ledger.sqlite"
    earlier = Ledger(path)
    earlier.register_devices(POOL.devices, simulated=True)
    earlier.close()
    db = sqlite3.connect(path)
    for table in ("acct_events", "acct_kernels"):
        db.execute(f"ALTER TABLE {table} RENAME COLUMN path TO label")
        db.execute(f"ALTER TABLE {table} DROP COLUMN kernel_name")
    db.execute("ALTER TABLE acct_kernels DROP COLUMN started_at")
    db.execute("DROP TRIGGER acct_slice_inserted")
    db.execute(
        "CREATE TRIGGER acct_slice_inserted AFTER INSERT ON slices WHEN new.state = 'running' BEGIN "
        "INSERT INTO acct_events (at, kernel_id, owner, what, memory, used, label, requested_at) VALUES "
        "(new.placed_at, new.kernel_id, new.owner, 'placed', new.memory, new.memory_used, "
        "COALESCE(NULLIF(new.path, ''), new.kernel_name), new.requested_at); END"
    )
    db.commit()
    db.close()
    ledger = Ledger(path)
    try:
        ledger.request(request("k1", "2G", name="python3-gpu", path=""), Policy())
        [row] = LedgerAccounts(ledger, lambda: GPUShare()).report(3600, "kernel", EVERYONE)["rows"]
        assert (row["notebook"], row["kernelspec"]) == (None, "python3-gpu")
        version = ledger.read_with(lambda db: db.execute("PRAGMA schema_version").fetchone()[0])
    finally:
        ledger.close()
    # Up to date, it is left alone: opening it again changes no trigger (every other
    # connection would have to reload the schema).
    again = Ledger(path)
    try:
        assert again.read_with(lambda db: db.execute("PRAGMA schema_version").fetchone()[0]) == version
    finally:
        again.close()


def test_activity_of_a_kernel_the_ledger_does_not_know_is_not_recorded(
    ledger: Ledger, accounts: LedgerAccounts
) -> None:
    assert accounts.note_activity("ghost", True, time.time(), 0, "suspend") is False
    ledger.request(request("k1", "2G"), Policy())
    assert accounts.note_activity("k1", False, 1000.0, 60, "release") is True
    view: dict[str, object] = {}
    show_idle(view, ledger.read_with(store.activity)["k1"])  # type: ignore[arg-type]
    assert view == {"idle_since": 1000.0, "idle_action": "release", "idle_action_at": 1060.0}
    show_idle(view, store.Activity(True, 1000.0, 60, "release"))  # type: ignore[arg-type]
    assert view["idle_since"] is None


# ---- fair share in the ledger's queue ---------------------------------------------------------------


def test_under_fair_a_user_with_one_waiting_start_goes_before_another_users_fifth(ledger: Ledger) -> None:
    ledger.request(request("blocker", "80G", owner="carol"), FAIR)
    for i in range(1, 6):
        assert isinstance(ledger.request(request(f"bob{i}", "16G", owner="bob"), FAIR), Waiting)
    waiting = ledger.request(request("alice1", "16G", owner="alice"), FAIR)
    # Nobody has used anything yet: arrival order, so alice is sixth.
    assert waiting == Waiting(6, waiting.reason)
    ledger.release("blocker")  # room for five of 16G: bob's first goes, then alice
    order: list[str] = []
    for _ in range(6):
        for kernel_id in [r.kernel_id for r in ledger.records() if r.state == "queued"]:
            if isinstance(ledger.try_place(kernel_id, FAIR), Placed):
                order.append(kernel_id)
                time.sleep(0.05)  # the slice holds memory for a while: its owner's use grows
                break
    assert order == ["bob1", "alice1", "bob2", "bob3", "bob4"]  # bob's fifth waits


def test_under_fair_the_position_and_reason_say_why(ledger: Ledger) -> None:
    ledger.request(request("blocker", "80G", owner="carol"), FAIR)
    ledger.request(request("bob1", "16G", owner="bob"), FAIR)
    time.sleep(0.05)
    outcome = ledger.request(request("alice1", "16G", owner="alice"), FAIR)
    assert isinstance(outcome, Waiting) and outcome.position == 2
    assert "under fair share" in outcome.reason


def test_kernel_pods_without_a_broker_keep_no_accounting_and_say_so_in_one_sentence() -> None:
    from jupyter_gpushare.backends.kubernetes.backend import PodAccounts
    from jupyter_gpushare.core.errors import NoAccountingError

    with pytest.raises(NoAccountingError, match="on Kubernetes the GPU broker keeps it") as raised:
        PodAccounts().usage(3600, "user")
    assert raised.value.status == 501
    assert PodAccounts().usage_totals() == []
