"""Placement (pure): best fit, overcommit, whole cards, MIG, quotas and the reasons people read."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jupyter_gpushare.backends.local.inventory import Device, MigInstance, parse_simulation
from jupyter_gpushare.core.placement.allocator import (
    Held,
    NoFit,
    Policy,
    Request,
    Spot,
    fit,
    fit_on_device,
    free_memory,
)
from jupyter_gpushare.core.sizes import parse_size

GiB = 2**30
MiB = 2**20


def cards(*gib: int) -> tuple[Device, ...]:
    return tuple(
        Device(index=index, uuid=f"GPU-{index}", name=f"card {index}", memory_total=size * GiB)
        for index, size in enumerate(gib)
    )


def ask(size: str, placement: str = "shared", kernel_id: str = "new", owner: str = "alice") -> Request:
    return Request(kernel_id, owner, parse_size(size), placement)  # type: ignore[arg-type]


def hold(
    kernel_id: str, device: Device, gib: float, owner: str = "alice", whole: bool = False, unit: str = ""
) -> Held:
    return Held(kernel_id, owner, device.uuid, unit or device.uuid, int(gib * GiB), whole)


def placed(outcome: Spot | NoFit) -> Spot:
    assert isinstance(outcome, Spot), outcome
    return outcome


def refused(outcome: Spot | NoFit) -> NoFit:
    assert isinstance(outcome, NoFit), outcome
    return outcome


# ---- best fit ---------------------------------------------------------------------------------


def test_best_fit_picks_the_fullest_device_that_still_fits() -> None:
    pool = cards(80, 80, 80)
    held = [hold("a", pool[0], 10), hold("b", pool[1], 60), hold("c", pool[2], 75)]
    spot = placed(fit(ask("10G"), pool, held))
    assert spot.device_uuid == pool[1].uuid
    assert spot.device_index == 1
    assert spot.memory == 10 * GiB
    assert not spot.whole_card
    # 30G no longer fits on GPU1 (20G free): the next fullest takes it.
    assert placed(fit(ask("30G"), pool, held)).device_index == 0


def test_best_fit_prefers_the_smaller_empty_card() -> None:
    pool = cards(80, 16)
    assert placed(fit(ask("4G"), pool, [])).device_index == 1
    assert placed(fit(ask("20G"), pool, [])).device_index == 0


@pytest.mark.parametrize(
    ("sizes", "held_gib"), [((80, 80), (0, 0)), ((80, 40), (60, 20)), ((16, 16, 16), (4, 4, 4))]
)
def test_ties_go_to_the_lowest_index(sizes: tuple[int, ...], held_gib: tuple[int, ...]) -> None:
    pool = cards(*sizes)
    held = [
        hold(f"k{i}", device, gib) for i, (device, gib) in enumerate(zip(pool, held_gib, strict=True)) if gib
    ]
    assert placed(fit(ask("1G"), pool, held)).device_index == 0


def test_a_full_device_is_skipped() -> None:
    pool = cards(16, 16)
    held = [hold("a", pool[0], 16)]
    assert placed(fit(ask("1M"), pool, held)).device_index == 1


# ---- overcommit -------------------------------------------------------------------------------


@pytest.mark.parametrize(("overcommit", "slices_of_8g"), [(1.0, 2), (1.5, 3), (2.0, 4)])
def test_overcommit_lets_reservations_reach_capacity_times_overcommit(
    overcommit: float, slices_of_8g: int
) -> None:
    (device,) = pool = cards(16)
    policy = Policy(overcommit=overcommit)
    held: list[Held] = []
    for number in range(slices_of_8g):
        spot = placed(fit(ask("8G", kernel_id=f"k{number}"), pool, held, policy))
        held.append(Held(f"k{number}", "alice", spot.device_uuid, spot.unit_uuid, spot.memory))
    assert sum(slice_.memory for slice_ in held) == int(device.memory_total * overcommit)
    refusal = refused(fit(ask("1M", kernel_id="one-more"), pool, held, policy))
    assert refusal.retry  # memory may come back


@pytest.mark.parametrize("overcommit", [1.0, 1.5, 2.0])
def test_overcommit_never_makes_one_slice_larger_than_its_card(overcommit: float) -> None:
    pool = cards(16)
    refusal = refused(fit(ask("20G"), pool, [], Policy(overcommit=overcommit)))
    assert not refusal.retry


def test_overcommit_does_not_put_a_slice_on_a_card_smaller_than_the_slice() -> None:
    # 20G "fits" the 16G card's overcommitted capacity (24G) but not its memory: it belongs on GPU0.
    pool = cards(80, 16)
    spot = placed(fit(ask("20G"), pool, [], Policy(overcommit=1.5)))
    assert spot.device_index == 0


# ---- whole cards ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "placement"), [("4G", "exclusive"), ("whole", "shared"), ("WHOLE", "exclusive")]
)
def test_a_whole_card_needs_an_empty_device(size: str, placement: str) -> None:
    pool = cards(80, 40)
    held = [hold("a", pool[0], 1)]
    spot = placed(fit(ask(size, placement), pool, held))
    assert spot.device_index == 1
    assert spot.whole_card
    assert spot.memory == pool[1].memory_total


def test_a_whole_card_waits_while_every_device_has_slices() -> None:
    pool = cards(80, 40)
    held = [hold("a", pool[0], 1), hold("b", pool[1], 1)]
    refusal = refused(fit(ask("whole", "exclusive"), pool, held))
    assert refusal.retry
    assert "GPU0" in refusal.reason and "GPU1" in refusal.reason


def test_a_whole_card_keeps_everyone_else_off_it() -> None:
    pool = cards(80)
    held = [hold("a", pool[0], 80, whole=True)]
    assert refused(fit(ask("1M"), pool, held)).retry
    assert refused(fit(ask("whole"), pool, held)).retry
    assert free_memory(pool[0], held, 2.0) == 0


# ---- percent ----------------------------------------------------------------------------------


def test_percent_resolves_on_the_device_it_lands_on() -> None:
    pool = cards(80, 16)
    spot = placed(fit(ask("25%"), pool, []))
    assert (spot.device_index, spot.memory) == (1, 4 * GiB)
    held = [hold("a", pool[1], 14)]
    spot = placed(fit(ask("25%"), pool, held))
    assert (spot.device_index, spot.memory) == (0, 20 * GiB)


# ---- MIG --------------------------------------------------------------------------------------

MIG_POOL = parse_simulation("1xA100-80GB:mig=1x3g.40gb+2x1g.10gb").devices


def mig_unit(profile_index: int) -> MigInstance:
    return MIG_POOL[0].mig[profile_index]


def hold_mig(kernel_id: str, profile_index: int, owner: str = "alice") -> Held:
    instance = mig_unit(profile_index)
    return Held(kernel_id, owner, MIG_POOL[0].uuid, instance.uuid, instance.memory_total)


@pytest.mark.parametrize(
    ("size", "held", "expected_instance"),
    [
        ("5G", [], 1),  # smallest that fits: a 1g.10gb
        ("10G", [], 1),
        ("5G", [1], 2),  # the first 1g.10gb is taken
        ("5G", [1, 2], 0),  # only the 3g.40gb is left
        ("20G", [], 0),
        ("25%", [], 0),  # a share of the parent card: 20G
        ("10%", [], 1),  # 8G
    ],
)
def test_mig_takes_the_smallest_free_instance_that_fits(
    size: str, held: list[int], expected_instance: int
) -> None:
    holds = [hold_mig(f"k{index}", index) for index in held]
    spot = placed(fit(ask(size, "mig"), MIG_POOL, holds))
    instance = mig_unit(expected_instance)
    assert spot.unit_uuid == instance.uuid
    assert spot.device_uuid == MIG_POOL[0].uuid
    assert spot.memory == instance.memory_total
    assert not spot.whole_card


def test_mig_refuses_whole() -> None:
    refusal = refused(fit(ask("whole", "mig"), MIG_POOL, []))
    assert not refusal.retry
    assert "whole" in refusal.reason


def test_mig_refuses_a_size_larger_than_every_instance_for_good() -> None:
    refusal = refused(fit(ask("50G", "mig"), MIG_POOL, []))
    assert not refusal.retry
    assert "40G" in refusal.reason  # the largest instance


def test_mig_says_in_use_when_every_fitting_instance_is_taken() -> None:
    refusal = refused(fit(ask("20G", "mig"), MIG_POOL, [hold_mig("a", 0)]))
    assert refusal.retry
    assert "in use" in refusal.reason


def test_mig_request_on_a_pool_without_mig_is_refused_for_good() -> None:
    refusal = refused(fit(ask("4G", "mig"), cards(80), []))
    assert not refusal.retry
    assert "MIG" in refusal.reason


def test_shared_request_on_a_pool_that_is_all_mig_is_refused_for_good() -> None:
    refusal = refused(fit(ask("4G"), MIG_POOL, []))
    assert not refusal.retry
    assert "mig" in refusal.reason.lower()


def test_shared_slices_skip_mig_cards() -> None:
    pool = parse_simulation("1xA100-80GB:mig=7x1g.10gb,1xA100-80GB").devices
    assert placed(fit(ask("4G"), pool, [])).device_index == 1


def test_mig_quota_is_checked_against_the_instance_actually_chosen() -> None:
    # A 5G request lands on a 1g.10gb (10G): within a 16G per-kernel limit, although the larger
    # 3g.40gb instance listed first would not be.
    policy = Policy(max_memory_per_kernel=16 * GiB)
    spot = placed(fit(ask("5G", "mig"), MIG_POOL, [], policy))
    assert spot.memory == 10 * GiB


def test_mig_quota_refusal_when_the_only_instance_left_is_above_the_limit() -> None:
    policy = Policy(max_memory_per_kernel=16 * GiB)
    refusal = refused(fit(ask("5G", "mig"), MIG_POOL, [hold_mig("a", 1), hold_mig("b", 2)], policy))
    assert "16G" in refusal.reason


# ---- quotas -----------------------------------------------------------------------------------


def test_per_kernel_limit_fails_at_once_with_the_limit_in_the_reason() -> None:
    refusal = refused(fit(ask("20G"), cards(80), [], Policy(max_memory_per_kernel=16 * GiB)))
    assert not refusal.retry
    assert "20G" in refusal.reason and "16G" in refusal.reason


def test_per_kernel_limit_applies_to_what_a_share_resolves_to() -> None:
    policy = Policy(max_memory_per_kernel=16 * GiB)
    assert refused(fit(ask("25%"), cards(80), [], policy)).retry is False
    assert placed(fit(ask("25%"), cards(80, 40), [], policy)).device_index == 1  # 10G on the 40G card


def test_per_user_limit_counts_only_that_users_slices() -> None:
    pool = cards(80)
    policy = Policy(max_memory_per_user=12 * GiB)
    held = [hold("mine", pool[0], 10, owner="alice"), hold("theirs", pool[0], 40, owner="bob")]
    refusal = refused(fit(ask("4G", owner="alice"), pool, held, policy))
    assert not refusal.retry
    assert "alice" in refusal.reason and "12G" in refusal.reason and "10G" in refusal.reason
    assert placed(fit(ask("2G", owner="alice"), pool, held, policy)).memory == 2 * GiB
    assert placed(fit(ask("12G", owner="carol"), pool, held, policy)).memory == 12 * GiB


def test_per_user_limit_ignores_the_kernels_own_slice_on_resize() -> None:
    pool = cards(80)
    policy = Policy(max_memory_per_user=12 * GiB)
    held = [hold("k", pool[0], 10)]
    assert placed(fit(ask("12G", kernel_id="k"), pool, held, policy)).memory == 12 * GiB


# ---- reasons ----------------------------------------------------------------------------------


def test_does_not_fit_names_the_free_memory() -> None:
    pool = cards(80)
    refusal = refused(fit(ask("30G"), pool, [hold("a", pool[0], 60)]))
    assert refusal.retry
    assert "30G" in refusal.reason
    assert "20G free on GPU0" in refusal.reason


def test_does_not_fit_lists_every_device_most_free_first() -> None:
    pool = cards(80, 16)
    held = [hold("a", pool[0], 72.5), hold("b", pool[1], 12)]
    reason = refused(fit(ask("10G"), pool, held)).reason
    assert "7.5G free on GPU0" in reason
    assert "4G free on GPU1" in reason
    assert reason.index("GPU0") < reason.index("GPU1")


@pytest.mark.parametrize("size", ["100G", "81G", "200000"])
def test_larger_than_every_device_fails_for_good_naming_the_largest(size: str) -> None:
    refusal = refused(fit(ask(size), cards(16, 80, 40), []))
    assert not refusal.retry
    assert "80G" in refusal.reason
    assert "GPU1" in refusal.reason


def test_an_empty_pool_refuses_for_good() -> None:
    assert not refused(fit(ask("1G"), (), [])).retry


# ---- resize -----------------------------------------------------------------------------------


def test_fit_on_device_stays_on_the_kernels_device_and_ignores_its_own_slice() -> None:
    pool = cards(80, 16)
    held = [hold("k", pool[1], 8)]
    # Growing to 14G: GPU0 is emptier, but a live resize cannot move the kernel.
    spot = placed(fit_on_device(ask("14G", kernel_id="k"), pool[1].uuid, pool, held))
    assert (spot.device_index, spot.memory) == (1, 14 * GiB)
    # The kernel's own 8G would not leave room for 14G if it were counted.
    assert placed(fit_on_device(ask("16G", kernel_id="k"), pool[1].uuid, pool, held)).memory == 16 * GiB


def test_fit_on_device_refuses_when_others_leave_too_little() -> None:
    pool = cards(80, 16)
    held = [hold("k", pool[1], 8), hold("other", pool[1], 4)]
    refusal = refused(fit_on_device(ask("14G", kernel_id="k"), pool[1].uuid, pool, held))
    assert refusal.retry
    # Free is what nobody has reserved, the kernel's own 8G included (as %gpu status and the pool
    # say it); what the kernel could grow to is said beside it.
    assert refusal.reason == "14G does not fit: 4G free on GPU1, so this kernel can grow to 12G"


def test_a_refusal_for_a_kernel_holding_slices_lists_each_device_apart() -> None:
    pool = cards(16, 16)
    held = [hold("k", pool[1], 8), hold("other", pool[1], 4), hold("other", pool[0], 10)]
    refusal = refused(fit(ask("14G", kernel_id="k"), pool, held))
    assert refusal.reason == (
        "14G does not fit: 6G free on GPU0; 4G free on GPU1, so this kernel can grow to 12G"
    )


def test_fit_on_device_for_a_device_that_left_the_pool() -> None:
    assert not refused(fit_on_device(ask("1G", kernel_id="k"), "GPU-gone", cards(80), [])).retry


# ---- properties over random pools and request streams -------------------------------------------


@st.composite
def pools(draw: st.DrawFn) -> tuple[Device, ...]:
    devices = []
    for index in range(draw(st.integers(1, 4))):
        memory_gib = draw(st.integers(8, 80))
        mig: tuple[MigInstance, ...] = ()
        if draw(st.integers(0, 3)) == 0:
            sizes = draw(st.lists(st.integers(1, memory_gib), min_size=1, max_size=4))
            while sum(sizes) > memory_gib:
                sizes.pop()
            mig = tuple(
                MigInstance(f"MIG-{index}-{ordinal}", f"{gib}g", gib * GiB)
                for ordinal, gib in enumerate(sizes)
            )
        devices.append(Device(index, f"GPU-{index}", f"card {index}", memory_gib * GiB, mig=mig))
    return tuple(devices)


SIZES = st.one_of(
    st.integers(1, 90 * 1024).map(lambda mib: f"{mib}M"),
    st.integers(1, 90).map(lambda gib: f"{gib}G"),
    st.integers(1, 100).map(lambda percent: f"{percent}%"),
    st.just("whole"),
)
REQUESTS = st.tuples(
    st.just("request"),
    SIZES,
    st.sampled_from(["shared", "shared", "exclusive", "mig"]),
    st.sampled_from(["ann", "ben"]),
)
RELEASES = st.tuples(st.just("release"), st.integers(0, 1000))


def unit_memory(devices: Sequence[Device], slice_: Held) -> int:
    for device in devices:
        if device.uuid == slice_.unit_uuid:
            return device.memory_total
        for instance in device.mig:
            if instance.uuid == slice_.unit_uuid:
                return instance.memory_total
    raise AssertionError(f"{slice_} is on no unit of the pool")


def check_invariants(devices: Sequence[Device], held: Sequence[Held], policy: Policy) -> None:
    for device in devices:
        on_device = [slice_ for slice_ in held if slice_.device_uuid == device.uuid]
        assert sum(slice_.memory for slice_ in on_device) <= int(device.memory_total * policy.overcommit)
        if any(slice_.whole_card for slice_ in on_device):
            assert len(on_device) == 1, "a whole card is shared"
        if device.mig_enabled:
            units = [slice_.unit_uuid for slice_ in on_device]
            assert len(units) == len(set(units)), "a MIG instance is held twice"
            assert all(unit in {instance.uuid for instance in device.mig} for unit in units)
    for slice_ in held:
        assert 0 < slice_.memory <= unit_memory(devices, slice_), "a slice is larger than its device"
        if policy.max_memory_per_kernel is not None:
            assert slice_.memory <= policy.max_memory_per_kernel
    if policy.max_memory_per_user is not None:
        for owner in {slice_.owner for slice_ in held}:
            assert sum(s.memory for s in held if s.owner == owner) <= policy.max_memory_per_user


def check_mig_choice(
    devices: Sequence[Device],
    held: Sequence[Held],
    policy: Policy,
    request: Request,
    outcome: Spot | NoFit,
) -> None:
    """A MIG request gets the smallest free instance that fits within the quotas, if there is one."""
    taken = {slice_.unit_uuid for slice_ in held}
    in_use = sum(slice_.memory for slice_ in held if slice_.owner == request.owner)
    allowed = sorted(
        instance.memory_total
        for device in devices
        for instance in device.mig
        if instance.uuid not in taken
        and instance.memory_total >= request.size.resolve(device.memory_total)
        and (policy.max_memory_per_kernel is None or instance.memory_total <= policy.max_memory_per_kernel)
        and (
            policy.max_memory_per_user is None or in_use + instance.memory_total <= policy.max_memory_per_user
        )
    )
    if allowed:
        assert isinstance(outcome, Spot), outcome
        assert outcome.memory == allowed[0]
    else:
        assert isinstance(outcome, NoFit)


@given(
    devices=pools(),
    overcommit=st.floats(1.0, 2.0),
    per_kernel=st.one_of(st.none(), st.integers(1, 80).map(lambda gib: gib * GiB)),
    per_user=st.one_of(st.none(), st.integers(1, 160).map(lambda gib: gib * GiB)),
    steps=st.lists(st.one_of(REQUESTS, RELEASES), min_size=1, max_size=40),
)
# Regression examples, found by this property: overcommit must not put a slice on a smaller card,
# and MIG quotas apply to the instance chosen.
@example(
    devices=cards(8, 9),
    overcommit=2.0,
    per_kernel=None,
    per_user=None,
    steps=[("request", "9G", "shared", "ann")],
)
@example(
    devices=MIG_POOL,
    overcommit=1.0,
    per_kernel=16 * GiB,
    per_user=None,
    steps=[("request", "5G", "mig", "ann")],
)
def test_no_sequence_of_requests_and_releases_breaks_the_pool(
    devices: tuple[Device, ...],
    overcommit: float,
    per_kernel: int | None,
    per_user: int | None,
    steps: list[tuple],
) -> None:
    policy = Policy(overcommit, per_kernel, per_user)
    held: list[Held] = []
    for number, step in enumerate(steps):
        if step[0] == "release":
            if held:
                held.pop(step[1] % len(held))
        else:
            _, size, placement, owner = step
            request = Request(f"k{number}", owner, parse_size(size), placement)
            outcome = fit(request, devices, held, policy)
            if placement == "mig" and size != "whole":
                check_mig_choice(devices, held, policy, request, outcome)
            if isinstance(outcome, Spot):
                device = next(device for device in devices if device.uuid == outcome.device_uuid)
                assert device.index == outcome.device_index
                if placement == "shared" and size != "whole":
                    assert outcome.memory == request.size.resolve(device.memory_total)
                held.append(
                    Held(
                        request.kernel_id,
                        owner,
                        outcome.device_uuid,
                        outcome.unit_uuid,
                        outcome.memory,
                        outcome.whole_card,
                    )
                )
            else:
                assert outcome.reason
        check_invariants(devices, held, policy)


@given(
    devices=pools(),
    overcommit=st.floats(1.0, 2.0),
    held_gib=st.lists(st.integers(1, 40), max_size=6),
    size=st.one_of(
        st.integers(1, 80 * 1024).map(lambda mib: f"{mib}M"), st.integers(1, 100).map(lambda p: f"{p}%")
    ),
)
@example(devices=cards(8, 9), overcommit=2.0, held_gib=[], size="8193M")
def test_shared_best_fit_is_the_tightest_device_and_never_refuses_a_fitting_request(
    devices: tuple[Device, ...], overcommit: float, held_gib: list[int], size: str
) -> None:
    policy = Policy(overcommit)
    plain = [device for device in devices if not device.mig_enabled]
    held: list[Held] = []
    for number, gib in enumerate(held_gib):
        outcome = fit(Request(f"h{number}", "ann", parse_size(f"{gib}G")), devices, held, policy)
        if isinstance(outcome, Spot):
            held.append(Held(f"h{number}", "ann", outcome.device_uuid, outcome.unit_uuid, outcome.memory))
    request = Request("new", "ben", parse_size(size))
    room = {}
    for device in plain:
        wanted = request.size.resolve(device.memory_total)
        left = free_memory(device, held, overcommit) - wanted
        if wanted <= device.memory_total and left >= 0:
            room[device.index] = left
    outcome = fit(request, devices, held, policy)
    if room:
        assert isinstance(outcome, Spot), outcome
        best = min(room.values())
        assert outcome.device_index == min(index for index, left in room.items() if left == best)
    else:
        assert isinstance(outcome, NoFit)


# ---- issue 11: the pool's largest device, the smallest slice ---------------------------------------


def test_a_resize_larger_than_any_gpu_names_the_largest_of_the_pool_not_the_kernels_card() -> None:
    a100, _, t4 = cards(80, 80, 16)
    held = [hold("k", t4, 4)]
    reason = refused(fit_on_device(ask("999999G", kernel_id="k"), t4.uuid, [a100, _, t4], held)).reason
    assert "largest: 80G on GPU0" in reason


def test_a_resize_larger_than_the_kernels_card_says_a_live_resize_cannot_move() -> None:
    a100, t4 = cards(80, 16)
    outcome = refused(fit_on_device(ask("40G", kernel_id="k"), t4.uuid, [a100, t4], [hold("k", t4, 4)]))
    assert "40G is larger than GPU1 (16G)" in outcome.reason and "cannot move" in outcome.reason
    assert not outcome.retry


def test_a_share_below_the_smallest_slice_is_refused_for_good() -> None:
    devices = cards(16)
    outcome = refused(fit(ask("1%"), devices, [], Policy(min_memory=256 * MiB)))
    assert "below the smallest GPU slice, 256M" in outcome.reason and not outcome.retry
    # On a larger card the same share is large enough.
    assert placed(fit(ask("1%"), cards(16, 80), [], Policy(min_memory=256 * MiB))).device_index == 1


# ---- exclusive cards of a size (issue #20) -------------------------------------------------------


def test_an_exclusive_request_larger_than_every_card_is_refused_as_such() -> None:
    request = Request("new", "alice", parse_size("whole"), "exclusive", at_least=parse_size("90G"))
    refusal = refused(fit(request, cards(16), []))
    assert not refusal.retry and refusal.code == "too_large"
    assert refusal.reason.startswith("90G is larger than any GPU in the pool (largest: 16G on GPU0)")


def test_an_exclusive_request_of_a_size_takes_a_card_at_least_that_large() -> None:
    pool = cards(16, 80)
    request = Request("new", "alice", parse_size("whole"), "exclusive", at_least=parse_size("20G"))
    assert placed(fit(request, pool, [])).device_uuid == "GPU-1"
    busy = refused(fit(request, pool, [hold("a", pool[1], 4)]))
    assert busy.retry  # the 16G card is free, but too small: wait for the 80G one
