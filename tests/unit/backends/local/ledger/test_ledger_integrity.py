"""The ledger knows it is the ledger: deleted, replaced, damaged, read-only and locked files (issue 11).

Real sqlite files and real processes: a child process holds the ledger where a test needs
another holder; nothing is faked.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local.inventory import parse_simulation
from jupyter_gpushare.backends.local.ledger import Ledger
from jupyter_gpushare.backends.local.ledger import file as ledger_file
from jupyter_gpushare.backends.local.ledger.faults import classify
from jupyter_gpushare.backends.local.ledger.file import (
    Note,
    deleted,
    header_problem,
    holders,
    identity_of,
    link_into_place,
    lock_holders,
    read_note,
    write_note,
)
from jupyter_gpushare.backends.local.ledger.lock import (
    Abandoned,
    LockTimeout,
    lock_blocking,
    lock_exclusive,
    run_in_writer,
    unlock,
)
from jupyter_gpushare.backends.processes import current_process
from jupyter_gpushare.core.errors import (
    LedgerBusyError,
    LedgerDamagedError,
    LedgerError,
    LedgerMissingError,
    LedgerReadOnlyError,
    LedgerReplacedError,
)
from jupyter_gpushare.core.placement.allocator import Policy
from jupyter_gpushare.core.records import NewRequest, Placed
from tests.support.polling import wait_until

GiB = 2**30
POOL = parse_simulation("2xA100-80GB").devices
ME = current_process()


def whole(kernel_id: str) -> NewRequest:
    return NewRequest(kernel_id, "alice", "s", "exclusive", "exclusive", "whole", None, ME, "k", "n.ipynb")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def ledger(path: Path) -> Iterator[Ledger]:
    ledger = Ledger(path, lock_timeout=1, restore_wait=0.5)
    ledger.register_devices(POOL, simulated=True)
    assert isinstance(ledger.request(whole("gpu0"), Policy()), Placed)
    ledger.records()  # what a server's views read every round: remembered
    yield ledger
    ledger.close()


def remove_all(path: Path) -> None:
    for leftover in glob.glob(f"{path}*"):
        os.unlink(leftover)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from jupyter_gpushare.backends.local.ledger import Ledger
    ledger = Ledger(sys.argv[1])
    ledger.records()  # opened, and kept open; no guard puts anything back
    print("ready", flush=True)
    time.sleep(60)
    """
)


NEWCOMER = textwrap.dedent(
    """
    import sys
    from jupyter_gpushare.core.errors import LedgerError
    from jupyter_gpushare.backends.local.ledger import Ledger
    try:
        print([record.kernel_id for record in Ledger(sys.argv[1], restore_wait=0.2).records()])
    except LedgerError as error:
        print(type(error).__name__, error)
    """
)


@pytest.fixture
def other_holder(path: Path, ledger: Ledger) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the ledger open, that does not mend it."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    yield child
    child.kill()
    child.wait()


# ---- deleted ------------------------------------------------------------------------------------


def test_a_deleted_ledger_is_put_back_from_the_open_copy(path: Path, ledger: Ledger) -> None:
    remove_all(path)
    assert ledger.check() is None
    assert path.exists()
    reopened = Ledger(path)
    assert [record.kernel_id for record in reopened.records()] == ["gpu0"]
    reopened.close()
    # The card stays held: a second whole card goes to GPU1, a third waits.
    assert isinstance(ledger.request(whole("gpu1"), Policy()), Placed)
    assert not isinstance(ledger.request(whole("third"), Policy()), Placed)


def test_a_kernels_start_and_end_write_little_to_a_new_or_put_back_ledger(path: Path, ledger: Ledger) -> None:
    """Small pages: a kernel's start and end write a quarter of what sqlite's default 4 KiB pages
    would to the write-ahead log (every changed page is a whole frame there), and a ledger put
    back after a deletion writes as little."""

    def log_bytes_of_a_start_and_end() -> int:
        with contextlib.closing(sqlite3.connect(path)) as database:
            assert database.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
        assert os.path.getsize(f"{path}-wal") == 0
        request = NewRequest("small", "alice", "s", "timeslice", "shared", "1G", None, ME, "k", "n.ipynb")
        assert isinstance(ledger.request(request, Policy()), Placed)
        assert ledger.release("small") is not None
        return os.path.getsize(f"{path}-wal")

    assert 0 < log_bytes_of_a_start_and_end() < 16 * 1024  # 4 KiB pages: about 41 KiB
    remove_all(path)
    assert ledger.check() is None  # put back from this process's open copy
    assert 0 < log_bytes_of_a_start_and_end() < 16 * 1024


def test_a_write_after_the_delete_lands_in_the_restored_file(path: Path, ledger: Ledger) -> None:
    remove_all(path)
    ledger.release("gpu0")  # no guard round in between: the write itself notices
    reopened = Ledger(path)
    assert reopened.records() == []
    reopened.close()


def test_every_holder_follows_the_restored_file(path: Path, ledger: Ledger) -> None:
    second = Ledger(path)
    assert [record.kernel_id for record in second.records()] == ["gpu0"]
    remove_all(path)
    assert ledger.check() is None  # one of them puts it back...
    assert isinstance(second.request(whole("gpu1"), Policy()), Placed)  # ...the other follows
    assert {record.kernel_id for record in ledger.records()} == {"gpu0", "gpu1"}
    second.close()


def test_a_new_process_does_not_start_an_empty_ledger_beside_a_live_holder(
    path: Path, ledger: Ledger, other_holder: subprocess.Popen[str]
) -> None:
    ledger.close()  # only the other process holds it now, and it does not put it back
    remove_all(path)
    newcomer = Ledger(path, restore_wait=0.5)
    with pytest.raises(LedgerMissingError) as caught:
        newcomer.records()
    assert f"process {other_holder.pid} (python" in str(caught.value)
    assert str(path) in str(caught.value)
    assert not path.exists(), "no second ledger was started"
    other_holder.kill()
    other_holder.wait()
    assert newcomer.records() == []  # nobody holds the old one any more: a fresh start is safe


# ---- replaced, damaged ----------------------------------------------------------------------------


def test_a_replaced_ledger_stops_placing_until_the_stranger_is_moved_away(path: Path, ledger: Ledger) -> None:
    stranger = path.with_name("stranger.sqlite")
    Ledger(stranger).register_devices(POOL, simulated=True)
    os.replace(stranger, path)
    with pytest.raises(LedgerReplacedError, match=r"move .* away"):
        ledger.request(whole("gpu1"), Policy())
    newcomer = subprocess.run([sys.executable, "-c", NEWCOMER, str(path)], capture_output=True, text=True)
    assert newcomer.stdout.startswith("LedgerReplacedError"), newcomer  # it would be a second ledger
    assert f"process {os.getpid()}" in newcomer.stdout
    path.unlink()  # the fix
    assert ledger.check() is None
    assert [record.kernel_id for record in ledger.records()] == ["gpu0"]
    newcomer = subprocess.run([sys.executable, "-c", NEWCOMER, str(path)], capture_output=True, text=True)
    assert newcomer.stdout.strip() == "['gpu0']", newcomer


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_a_damaged_ledger_is_refused_then_started_afresh_with_the_slices_last_seen(
    path: Path, ledger: Ledger, damage: str
) -> None:
    if damage == "garbage":
        with path.open("r+b") as file:
            file.write(b"\x00garbage" * 1024)
    else:
        os.truncate(path, 0)
    with pytest.raises(LedgerDamagedError, match=f"mv {path} {path}.broken"):
        ledger.request(whole("gpu1"), Policy())
    with pytest.raises(LedgerDamagedError):
        Ledger(path, restore_wait=0.2).records()  # a newcomer neither
    path.rename(f"{path}.broken")
    assert ledger.check() is None
    assert [record.kernel_id for record in ledger.records()] == ["gpu0"]
    assert [device.uuid for device in ledger.devices()] == [device.uuid for device in POOL]
    second = ledger.request(whole("gpu1"), Policy())
    assert isinstance(second, Placed) and second.record.device_uuid == POOL[1].uuid


def test_a_ledger_damaged_after_it_was_put_back_is_its_fault_in_every_thread(
    path: Path, ledger: Ledger
) -> None:
    """Issue 37's report: put back by another thread (the guard's), the file is new to this one,
    whose next call opens a connection to it; one that cannot be opened (the file is garbage by
    then) leaves this thread none. The fault, every time: not a TypeError from the connection it
    held before, which stopped a server's shutdown."""
    remove_all(path)
    found: list[LedgerError | None] = []
    mender = threading.Thread(target=lambda: found.append(ledger.check()))
    mender.start()
    mender.join()
    assert found == [None] and path.exists()
    path.write_bytes(os.urandom(40_000))
    for _ in range(2):
        with pytest.raises(LedgerDamagedError, match="file is not a database"):
            ledger.release("gpu0")
    path.rename(f"{path}.broken")  # the fix the sentence names: this thread goes on
    assert ledger.check() is None
    assert ledger.release("gpu0") is not None


def test_a_fault_is_logged_once_whoever_meets_it(
    path: Path, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    os.truncate(path, 0)
    fault = ledger.check()
    assert isinstance(fault, LedgerDamagedError)
    with caplog.at_level(logging.WARNING, logger="jupyter_gpushare"):
        ledger.report_fault(fault)  # a kernel's cleanup
        ledger.report_fault(fault)  # another's
        ledger._access.guard.round()  # the guard's round, which meets it too
        # The same fault in other words (a file truncated while sqlite read it: "no such table"
        # first, then "the file is empty"): still one fault.
        ledger.report_fault(LedgerDamagedError(f"The GPU ledger {path} is damaged (no such table: devices)"))
        assert [record.getMessage() for record in caplog.records] == [f"jupyter_gpushare: {fault}"]
        path.rename(f"{path}.broken")
        ledger._access.guard.round()  # mended: said once, and the fault is new again next time
        os.truncate(path, 0)
        ledger._access.guard.round()
    assert [record.getMessage() for record in caplog.records][1:] == [
        f"jupyter_gpushare: the damaged GPU ledger {path} was moved away; started afresh with the 1 "
        "slice(s) this process last saw",
        f"jupyter_gpushare: the GPU ledger {path} is usable again",
        f"jupyter_gpushare: {ledger.check()}",
    ]


def test_a_holder_that_did_not_start_afresh_records_its_slices_again(path: Path, ledger: Ledger) -> None:
    other = Ledger(path)
    other.records()
    with path.open("r+b") as file:
        file.write(b"garbage!" * 1024)
    path.rename(f"{path}.broken")
    assert other.check() is None  # it starts the new ledger...
    assert ledger.check() is None  # ...and this one follows, recording what it saw
    assert [record.kernel_id for record in ledger.records()] == ["gpu0"]
    other.close()


# ---- read-only, locked ------------------------------------------------------------------------------


def test_lock_timeouts_name_the_process_holding_the_lock(path: Path, ledger: Ledger) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(60)",
            f"{path}.lock",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(LedgerBusyError) as caught:
            ledger.release("gpu0")
        assert time.monotonic() - started < 5
        assert f"process {child.pid}" in str(caught.value) and "1 s" in str(caught.value)
        assert ledger.get("gpu0") is not None, "nothing was changed"
    finally:
        child.kill()
        child.wait()
    assert ledger.release("gpu0") is not None


def test_an_immutable_or_unwritable_ledger_is_read_only_for_this_user(path: Path, ledger: Ledger) -> None:
    error = classify(sqlite3.OperationalError("attempt to write a readonly database"), path, 1)
    assert isinstance(error, LedgerReadOnlyError)
    assert "read-only for user" in str(error) and "chattr -i" in str(error)
    assert isinstance(classify(PermissionError(13, "Permission denied"), path, 1), LedgerReadOnlyError)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (sqlite3.DatabaseError("file is not a database"), LedgerDamagedError),
        (sqlite3.DatabaseError("database disk image is malformed"), LedgerDamagedError),
        (sqlite3.OperationalError("no such table: slices"), LedgerDamagedError),
        (sqlite3.OperationalError("database is locked"), LedgerBusyError),
        (sqlite3.OperationalError("disk I/O error"), LedgerError),
        (OSError(28, "No space left on device"), LedgerError),
    ],
)
def test_each_fault_is_one_sentence_with_the_file(path: Path, error: Exception, kind: type) -> None:
    fault = classify(error, path, 10)
    assert type(fault) is kind
    assert str(path) in str(fault) and "\n" not in str(fault)
    assert fault.status == 503


# ---- the pieces ------------------------------------------------------------------------------------


def test_the_note_round_trips_and_a_garbled_one_reads_as_none(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        assert read_note(fd) is None
        note = Note("abc", (1, 2), "old")
        write_note(fd, note)
        assert read_note(fd) == note
        write_note(fd, Note("b", (3, 4)))
        assert read_note(fd) == Note("b", (3, 4), None)
        os.pwrite(fd, b"{not json", 0)
        assert read_note(fd) is None
    finally:
        os.close(fd)


def test_header_problems(tmp_path: Path) -> None:
    good, empty, junk = tmp_path / "good", tmp_path / "empty", tmp_path / "junk"
    sqlite3.connect(good).execute("CREATE TABLE t (x)").connection.commit()
    empty.touch()
    junk.write_bytes(b"x" * 200)
    for file, expected in ((good, None), (empty, "truncated"), (junk, "not a database")):
        fd = os.open(file, os.O_RDONLY)
        try:
            problem = header_problem(fd)
            assert (problem is None) if expected is None else (expected in str(problem))
        finally:
            os.close(fd)


HOLD_OPEN = "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(60)"


def test_holders_are_found_by_file_even_once_deleted_or_moved(tmp_path: Path) -> None:
    target = tmp_path / "held"
    target.write_text("x")
    identity = identity_of(target)
    assert identity is not None
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(60)",
            str(target),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        assert [holder.pid for holder in holders(files=[identity])] == [child.pid]
        target.rename(tmp_path / "moved")
        assert [holder.pid for holder in holders(files=[identity])] == [child.pid]
        (tmp_path / "moved").rename(target)
        target.unlink()
        assert [holder.pid for holder in holders([deleted(target)])] == [child.pid]
        assert "python" in holders([deleted(target)])[0].command
    finally:
        child.kill()
        child.wait()
    assert holders(files=[identity]) == []


def test_a_copy_is_linked_into_place_and_never_over_another_file(tmp_path: Path) -> None:
    source = sqlite3.connect(":memory:")
    source.execute("CREATE TABLE t (x)")
    source.execute("INSERT INTO t VALUES (42)")
    source.commit()
    target = tmp_path / "copy.sqlite"
    assert link_into_place(source, target, 0o640) == identity_of(target)
    assert sqlite3.connect(target).execute("SELECT x FROM t").fetchall() == [(42,)]
    assert os.stat(target).st_mode & 0o777 == 0o640
    with pytest.raises(FileExistsError):
        link_into_place(source, target, None)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")], "no copy is left behind"


def test_a_bounded_lock_times_out_and_its_abandoned_waiter_lets_go(tmp_path: Path) -> None:
    lock_path = tmp_path / "lock"
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = os.open(lock_path, os.O_RDWR)
    with pytest.raises(LockTimeout):
        lock_exclusive(waiter, 0.2)  # ``waiter`` now belongs to the abandoned helper
    assert [h.pid for h in lock_holders(lock_path)] == []  # this process's own lock is not listed
    fcntl.flock(holder, fcntl.LOCK_UN)
    fresh = os.open(lock_path, os.O_RDWR)
    deadline = time.monotonic() + 5
    while True:  # the helper takes the lock when it is freed, and lets go at once
        try:
            lock_exclusive(fresh, 0.2)
            break
        except LockTimeout:
            fresh = os.open(lock_path, os.O_RDWR)
            assert time.monotonic() < deadline
    unlock(fresh)
    os.close(fresh)
    os.close(holder)


def test_a_ledger_started_in_a_directory_shared_through_a_group_is_group_writable(tmp_path: Path) -> None:
    """A team box shares the ledger's directory through a group (setgid): a ledger any member's
    process starts there afresh must be writable by the others, whatever that member's umask."""
    shared, own = tmp_path / "team", tmp_path / "own"
    shared.mkdir(mode=0o700)
    own.mkdir(mode=0o700)
    os.chmod(shared, 0o2770)
    umask = os.umask(0o022)
    try:
        for directory, expected in ((shared, 0o660), (own, 0o644)):
            ledger = Ledger(directory / "ledger.sqlite")
            ledger.register_devices(POOL, True)
            ledger.close()
            for name in ("ledger.sqlite", "ledger.sqlite.lock"):
                assert (directory / name).stat().st_mode & 0o777 == expected, (directory, name)
    finally:
        os.umask(umask)


HOLD_DATABASE = (
    "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1]); db.execute('PRAGMA journal_mode = WAL');"
    " db.execute('SELECT 1 FROM sqlite_master').fetchall(); print('open', flush=True); time.sleep(60)"
)


def test_a_process_holding_the_database_is_found_by_sqlites_lock_without_its_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's descriptors cannot be read (nor anyone's under hidepid): here no process's
    can, and the holder is still found, by the shared lock sqlite keeps on a WAL database."""
    database = tmp_path / "ledger.sqlite"
    sqlite3.connect(database).close()
    identity = identity_of(database)
    assert identity is not None
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_DATABASE, str(database)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        monkeypatch.setattr(ledger_file, "_holds", lambda *unreadable: False)  # no descriptor readable
        database.unlink()  # deleted: only the lock, by device and inode, still names the file
        assert [holder.pid for holder in holders(files=[identity])] == [child.pid]
        assert holders(files=[(identity[0], identity[1] + 1)]) == []
    finally:
        child.kill()
        child.wait()
    assert holders(files=[identity]) == []


def test_proc_locks_lines_name_holders_and_waiters_of_the_wanted_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wanted = (os.makedev(0xFE, 1), 5678)
    (tmp_path / "locks").write_text(
        "1: POSIX  ADVISORY  READ 101 fe:01:5678 1073741826 1073742335\n"
        "2: FLOCK  ADVISORY  WRITE 102 fe:01:5678 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 103 fe:01:5678 0 EOF\n"
        "3: POSIX  ADVISORY  READ 104 fe:01:56789 128 128\n"
        "4: POSIX  ADVISORY  READ 105 fe:02:5678 128 128\n"
        f"5: POSIX  ADVISORY  READ {os.getpid()} fe:01:5678 128 128\n"
        "6: POSIX  ADVISORY  READ 101 fe:01:5678 128 128\n"
        "7: garbage\n"
    )
    monkeypatch.setattr(ledger_file, "_PROC", tmp_path)  # no pid directories: locks only
    assert [holder.pid for holder in holders(files=[wanted])] == [101, 102, 103]
    assert holders() == []


def contended_lock(lock_path: Path, holder: int) -> None:
    """Take the lock on a fresh descriptor while ``holder`` has it, until a timer lets go."""
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = os.open(lock_path, os.O_RDWR)
    letting_go = threading.Timer(0.05, fcntl.flock, (holder, fcntl.LOCK_UN))
    letting_go.start()
    try:
        lock_exclusive(waiter, 10)
    finally:
        letting_go.join()
    unlock(waiter)
    os.close(waiter)


def test_contended_locks_are_waited_for_by_helpers_that_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several writing processes meet a held lock on nearly every write: starting a thread for
    each wait cost more than the write (issue 24)."""
    lock_path = tmp_path / "lock"
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    contended_lock(lock_path, holder)  # at least one helper exists now
    started: list[str] = []
    start = threading.Thread.start

    def counting(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting)
    for _ in range(10):
        contended_lock(lock_path, holder)
    assert "gpushare-ledger-lock" not in started
    os.close(holder)


def test_a_forked_child_waits_with_helpers_of_its_own(tmp_path: Path) -> None:
    """The parent's kept helpers do not exist in a forked child: it must start its own."""
    lock_path = tmp_path / "lock"
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    contended_lock(lock_path, holder)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit status is the assertion
        try:
            contended_lock(lock_path, os.open(lock_path, os.O_RDWR))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's contended lock timed out"
    os.close(holder)


# ---- contended writes run whole in a writer thread ----------------------------------------------


def held_until_timer(lock_path: Path, seconds: float) -> threading.Timer:
    """The ledger's lock, held on a descriptor of this test's own until a timer lets go."""
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    timer = threading.Timer(seconds, lambda: (fcntl.flock(holder, fcntl.LOCK_UN), os.close(holder)))
    timer.start()
    return timer


def test_a_contended_write_runs_whole_in_a_writer_thread(path: Path, ledger: Ledger) -> None:
    """The thread that gets a contended lock is the one that writes: the lock is never held by a
    thread still waiting for a CPU to wake it (issue 24, four processes on two cores)."""
    timer = held_until_timer(Path(f"{path}.lock"), 0.1)

    def work(db: sqlite3.Connection) -> str:
        db.execute("UPDATE slices SET owner = 'bob' WHERE kernel_id = 'gpu0'")
        return threading.current_thread().name

    assert ledger.write_with(work) == "gpushare-ledger-lock"
    timer.join()
    record = ledger.get("gpu0")
    assert record is not None and record.owner == "bob"
    # Free, the lock is taken in the caller's own thread.
    assert ledger.write_with(lambda db: threading.current_thread().name) == threading.current_thread().name


def test_an_error_in_a_contended_write_rolls_it_back_and_reaches_the_caller(
    path: Path, ledger: Ledger
) -> None:
    timer = held_until_timer(Path(f"{path}.lock"), 0.1)

    def work(db: sqlite3.Connection) -> None:
        db.execute("UPDATE slices SET owner = 'bob' WHERE kernel_id = 'gpu0'")
        raise ValueError("changed its mind")

    with pytest.raises(ValueError, match="changed its mind"):
        ledger.write_with(work)
    timer.join()
    record = ledger.get("gpu0")
    assert record is not None and record.owner == "alice"
    assert ledger.release("gpu0") is not None  # and the lock was let go


def test_a_write_abandoned_before_it_had_the_lock_never_runs(tmp_path: Path) -> None:
    lock_path = tmp_path / "lock"
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = os.open(lock_path, os.O_RDWR)
    claims: list[bool] = []
    ran: list[str] = []

    def work(claim: Callable[[], bool]) -> str:
        lock_blocking(waiter)
        claims.append(claim())
        if not claims[-1]:
            unlock(waiter)
            raise Abandoned()
        ran.append("ran")
        unlock(waiter)
        return "ran"

    with pytest.raises(LockTimeout):
        run_in_writer(work, 0.2)
    fcntl.flock(holder, fcntl.LOCK_UN)
    wait_until(lambda: claims == [False], timeout=10, message="the writer never got the lock")
    assert ran == []
    os.close(holder)


def test_a_write_that_started_in_time_is_seen_through(tmp_path: Path) -> None:
    """Once the writer runs the transaction, the caller's deadline no longer cuts it short: it
    may commit, so the caller must not report it as not done."""
    started = threading.Event()

    def work(claim: Callable[[], bool]) -> int:
        assert claim()
        started.set()
        time.sleep(0.5)  # a slow transaction, past the caller's 0.1 s
        return 42

    assert run_in_writer(work, 0.1) == 42
    assert started.is_set()
