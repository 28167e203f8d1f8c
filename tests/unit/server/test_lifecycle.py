"""What a server reclaims: queued starts nobody asks after, kernels nobody uses (pure verdicts)."""

from __future__ import annotations

import pytest

from jupyter_gpushare.server.lifecycle import judge, unused_warning

TIMEOUT = 300.0


@pytest.mark.parametrize(
    ("last_asked", "withdrawn"),
    [(1000.0, False), (1000.0 - TIMEOUT + 1, False), (1000.0 - TIMEOUT, True), (0.0, True)],
)
def test_a_queued_start_is_withdrawn_once_nobody_asked_after_it_for_the_timeout(
    last_asked: float, withdrawn: bool
) -> None:
    verdict = judge(1000.0, TIMEOUT, {"k": last_asked}, {}, {})
    assert (verdict.withdraw == {"k"}) is withdrawn
    assert verdict.shut_down == frozenset()


def test_an_unused_kernel_is_remembered_then_shut_down_after_the_timeout() -> None:
    first = judge(1000.0, TIMEOUT, {}, {"orphan": False, "used": True}, {})
    assert dict(first.unused_since) == {"orphan": 1000.0} and first.shut_down == frozenset()
    later = judge(1000.0 + TIMEOUT - 1, TIMEOUT, {}, {"orphan": False, "used": True}, first.unused_since)
    assert later.shut_down == frozenset() and dict(later.unused_since) == {"orphan": 1000.0}
    due = judge(1000.0 + TIMEOUT, TIMEOUT, {}, {"orphan": False, "used": True}, later.unused_since)
    assert due.shut_down == {"orphan"}


def test_a_kernel_used_again_starts_its_count_anew() -> None:
    first = judge(1000.0, TIMEOUT, {}, {"k": False}, {})
    used = judge(1200.0, TIMEOUT, {}, {"k": True}, first.unused_since)
    assert dict(used.unused_since) == {}
    again = judge(1400.0, TIMEOUT, {}, {"k": False}, used.unused_since)
    assert dict(again.unused_since) == {"k": 1400.0} and again.shut_down == frozenset()


def test_a_kernel_that_is_gone_is_forgotten() -> None:
    first = judge(1000.0, TIMEOUT, {}, {"k": False}, {})
    assert dict(judge(1001.0, TIMEOUT, {}, {}, first.unused_since).unused_since) == {}


def test_timeout_zero_reclaims_nothing_but_still_says_what_is_unused() -> None:
    verdict = judge(10_000.0, 0, {"queued": 0.0}, {"k": False}, {"k": 0.0})
    assert verdict.withdraw == verdict.shut_down == frozenset()
    assert dict(verdict.unused_since) == {"k": 0.0}
    assert unused_warning(0) == "no notebook or console uses this kernel"
    assert unused_warning(300) == (
        "no notebook or console uses this kernel: it is shut down once unused for 300 s "
        "(GPUShare.unused_kernel_timeout)"
    )
