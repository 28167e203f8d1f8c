"""The ledger never offers memory a live process holds (docs/how-it-works/ledger.md), on a real ledger file.

A simulated pool has no NVML: what a kernel declares it uses stands for what its processes hold,
as it does everywhere on such a pool. A shrink below it is refused with the numbers (or, forced,
the held memory stays reserved), a release keeps it reserved, and no placement — a start, a
grow — ever lands in it. The property test drives random sequences of declare, shrink, release,
start and end against an independent model of what each kernel's process really holds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.core.errors import DoesNotFitError, NoSliceError
from jupyter_gpushare.core.records import ProcessIdentity
from tests.unit.backends.local.test_local_backend import make_service

GiB = 2**30


def declare(service: LocalBackend, kernel_id: str, used: float) -> None:
    service.ledger.report_usage(kernel_id, int(used * GiB), None, "simulated")


async def start(service: LocalBackend, kernel_id: str, size: str) -> None:
    await service.acquire(kernel_id, service.check(size, kernel_id=kernel_id))
    service.attach_kernel(kernel_id, os.getpid())


def reserved(service: LocalBackend, device: int = 0) -> int:
    return service.pool()["devices"][device]["memory_reserved"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LocalBackend]:
    service = make_service(tmp_path, simulate="1xT4-16GB", when_full="fail")
    yield service
    service.ledger.close()


async def test_a_shrink_below_what_the_kernel_holds_is_refused_with_the_numbers(
    service: LocalBackend,
) -> None:
    await start(service, "k1", "4G")
    declare(service, "k1", 3.8)
    with pytest.raises(DoesNotFitError) as refused:
        service.resize("k1", "1G")
    message = str(refused.value)
    assert "1G is less than the 3.8G this kernel holds on GPU0 (declared on this simulated pool)" in message
    assert "nothing was changed" in message and "del the tensors" in message
    assert "%gpu resize 1G --force" in message
    record = service.ledger.get("k1")
    assert record is not None and record.memory == 4 * GiB
    # Above what it holds, a shrink is fine.
    assert service.resize("k1", "3900M").memory == 3900 * 2**20


async def test_a_forced_shrink_keeps_the_held_memory_reserved_until_it_is_freed(
    service: LocalBackend,
) -> None:
    await start(service, "k1", "4G")
    declare(service, "k1", 3.8)
    record = service.resize("k1", "1G", force=True)
    assert record.memory == 1 * GiB and record.held_beyond == int(3.8 * GiB)
    assert reserved(service) == int(3.8 * GiB)
    view = next(view for view in service.all_kernels() if view["kernel_id"] == "k1")
    assert view["held"] == int(3.8 * GiB) and view["memory_request"] == 1 * GiB
    # 16G card, 3.8G held: 12.2G is all a second kernel can have.
    with pytest.raises(DoesNotFitError, match=r"12\.2G free on GPU0"):
        await start(service, "k2", "13G")
    declare(service, "k1", 0.5)  # freed: the slice's own 1G counts again
    assert reserved(service) == 1 * GiB
    await start(service, "k2", "15G")


async def test_a_release_keeps_what_the_kernel_still_holds_reserved(service: LocalBackend) -> None:
    await start(service, "k1", "12G")
    declare(service, "k1", 11)
    released, held = service.give_back("k1")
    assert released.memory == 12 * GiB and held.memory == 11 * GiB and held.source == "simulated"
    assert service.ledger.get("k1") is None
    assert reserved(service) == 11 * GiB
    view = next(view for view in service.all_kernels() if view["kernel_id"] == "k1")
    assert (view["state"], view["held"], view["device"]) == ("released", 11 * GiB, 0)
    with pytest.raises(DoesNotFitError, match="5G free on GPU0"):
        await start(service, "k2", "8G")
    service.ledger.update_held([("k1", 0, "simulated")])  # the kernel freed its tensors
    assert reserved(service) == 0
    await start(service, "k2", "8G")


async def test_a_kernel_holding_memory_takes_its_next_slice_where_it_holds_it(tmp_path: Path) -> None:
    service = make_service(tmp_path, simulate="2xT4-16GB")
    await start(service, "k1", "8G")  # best fit: GPU0
    declare(service, "k1", 2)
    service.give_back("k1")
    await start(service, "big", "15G")  # GPU1: GPU0 has 2G held
    assert service.ledger.get("big").device_uuid == service.devices()[1].uuid  # type: ignore[union-attr]
    await start(service, "k1", "4G")
    record = service.ledger.get("k1")
    assert record is not None and record.device_uuid == service.devices()[0].uuid
    assert record.memory_used == 2 * GiB  # its held memory counts in its new slice
    assert service.ledger.released("k1") is None


async def test_what_a_dead_kernel_held_is_freed_with_its_process(service: LocalBackend) -> None:
    await start(service, "k1", "12G")
    declare(service, "k1", 11)
    service.give_back("k1")
    gone = ProcessIdentity(2**22 + 1, 1.0)  # no such process
    service.ledger.put_released(
        service.ledger.released("k1").__class__(  # type: ignore[union-attr]
            "k1", None, "", "", gone, owner="alice", device_uuid=service.devices()[0].uuid, held=11 * GiB
        )
    )
    assert reserved(service) == 11 * GiB
    await start(service, "k2", "8G")  # placement drops what dead processes held
    assert service.ledger.released("k1") is None


async def test_a_released_kernel_cannot_release_again(service: LocalBackend) -> None:
    await start(service, "k1", "4G")
    service.give_back("k1")
    with pytest.raises(NoSliceError, match="holds no GPU slice"):
        service.give_back("k1")
    assert service.ledger.released("k1") is not None  # its claim is not lost by asking twice


# ---- the property --------------------------------------------------------------------------

KERNELS = ("k0", "k1", "k2")
SIZES = st.sampled_from((2, 5, 8, 12))  # GiB, on two 16 GiB cards
Step = tuple[str, str, int, bool]
steps = st.lists(
    st.tuples(
        st.sampled_from(("start", "declare", "shrink", "release", "end")),
        st.sampled_from(KERNELS),
        SIZES,
        st.booleans(),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=60)
@given(steps)
def test_no_placement_ever_lands_in_memory_a_live_process_holds(
    tmp_path_factory, sequence: list[Step]
) -> None:
    service = make_service(tmp_path_factory.mktemp("held"), simulate="2xT4-16GB", when_full="fail")
    capacity = 16 * GiB
    holds: dict[str, int] = {}  # the model: what each kernel's process really holds
    where: dict[str, str] = {}  # and on which card
    try:
        for action, kernel_id, gib, force in sequence:
            record = service.ledger.get(kernel_id)
            if action == "start" and record is None:
                try:
                    asyncio.run(start(service, kernel_id, f"{gib}G"))
                except DoesNotFitError:
                    continue
                placed = service.ledger.get(kernel_id)
                assert placed is not None and placed.device_uuid is not None
                if holds.get(kernel_id):
                    assert placed.device_uuid == where[kernel_id]  # memory stays where it is held
                where[kernel_id] = placed.device_uuid
            elif action == "declare" and record is not None:
                # A process allocates within its slice (its framework is capped to it).
                used = min(gib * GiB, record.memory)
                declare(service, kernel_id, used / GiB)
                holds[kernel_id] = used
            elif action == "shrink" and record is not None:
                try:
                    service.resize(kernel_id, f"{gib}G", force=force)
                except DoesNotFitError as refusal:
                    assert gib * GiB < holds.get(kernel_id, 0) or "does not fit" in str(refusal)
            elif action == "release" and record is not None:
                service.give_back(kernel_id)
            elif action == "end":
                service.free(kernel_id)  # the kernel ends: what it held is freed with it
                holds.pop(kernel_id, None)
            for device in service.devices():
                taken = 0
                for other in KERNELS:
                    row = service.ledger.get(other)
                    slice_memory = row.memory if row is not None and row.device_uuid == device.uuid else 0
                    held = holds.get(other, 0) if where.get(other) == device.uuid else 0
                    taken += max(slice_memory, held)
                assert taken <= capacity, (device.label, sequence)
    finally:
        service.ledger.close()
