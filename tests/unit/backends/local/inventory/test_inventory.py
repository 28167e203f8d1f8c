"""The pool: a simulated description, or NVML (through a fake ``pynvml``)."""

from __future__ import annotations

import re

import pytest

from jupyter_gpushare.backends.local.inventory import (
    Inventory,
    SimulationSpecError,
    discover,
    parse_simulation,
    read_nvml_inventory,
)
from jupyter_gpushare.backends.local.inventory import nvml as nvml_module
from jupyter_gpushare.backends.local.inventory import simulated as simulated_module
from tests.support.nvml_fake import FakeBoard, FakeMig

GiB = 2**30
MiB = 2**20


# ---- simulated pools --------------------------------------------------------------------------


def test_two_models_make_three_devices_in_order() -> None:
    inventory = parse_simulation("2xA100-80GB,1xT4-16GB")
    assert inventory.source == "simulated"
    assert inventory.simulated
    assert [device.index for device in inventory.devices] == [0, 1, 2]
    assert [device.memory_total for device in inventory.devices] == [80 * GiB, 80 * GiB, 16 * GiB]
    assert ["A100" in device.name for device in inventory.devices] == [True, True, False]
    assert "T4" in inventory.devices[2].name
    assert [device.label for device in inventory.devices] == ["GPU0", "GPU1", "GPU2"]
    assert not any(device.mig_enabled for device in inventory.devices)
    # Simulated boards have no measurements.
    assert all(device.memory_used is None for device in inventory.devices)


@pytest.mark.parametrize(
    ("spec", "memories"),
    [
        ("1xT4-16GB", [16]),
        ("T4-16GB", [16]),
        ("3xL4-24G", [24, 24, 24]),
        ("1 x H100-80GiB", [80]),
        ("2XA10-24gb, 1xA100-40GB", [24, 24, 40]),
    ],
)
def test_spellings_of_a_simulated_pool(spec: str, memories: list[int]) -> None:
    inventory = parse_simulation(spec)
    assert [device.memory_total for device in inventory.devices] == [m * GiB for m in memories]
    assert [device.index for device in inventory.devices] == list(range(len(memories)))


def test_uuids_are_deterministic_and_distinct() -> None:
    first = parse_simulation("2xA100-80GB,1xT4-16GB")
    second = parse_simulation("2xA100-80GB,1xT4-16GB")
    uuids = [device.uuid for device in first.devices]
    assert uuids == [device.uuid for device in second.devices]
    assert len(set(uuids)) == len(uuids)
    # CUDA_VISIBLE_DEVICES accepts device UUIDs in NVML's GPU-<uuid> form.
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", uuid) for uuid in uuids)


def test_different_pools_do_not_share_uuids() -> None:
    a100 = parse_simulation("1xA100-80GB").devices[0].uuid
    t4 = parse_simulation("1xT4-16GB").devices[0].uuid
    assert a100 != t4


def test_mig_layout() -> None:
    inventory = parse_simulation("1xA100-80GB:mig=1x3g.40gb+2x1g.10gb")
    (device,) = inventory.devices
    assert device.mig_enabled
    assert [instance.profile for instance in device.mig] == ["3g.40gb", "1g.10gb", "1g.10gb"]
    assert [instance.memory_total for instance in device.mig] == [40 * GiB, 10 * GiB, 10 * GiB]
    uuids = [instance.uuid for instance in device.mig]
    assert len(set(uuids)) == 3
    assert device.uuid not in uuids
    assert all(uuid.startswith("MIG-") for uuid in uuids)
    again = parse_simulation("1xA100-80GB:mig=1x3g.40gb+2x1g.10gb").devices[0]
    assert [instance.uuid for instance in again.mig] == uuids


def test_mig_and_plain_devices_mix() -> None:
    inventory = parse_simulation("1xA100-80GB:mig=7x1g.10gb,1xT4-16GB")
    assert len(inventory.devices[0].mig) == 7
    assert not inventory.devices[1].mig_enabled
    assert inventory.devices[1].index == 1


def test_the_example_in_error_messages_is_itself_a_valid_pool() -> None:
    parts = re.findall(r"[0-9]x[A-Za-z0-9:=.+x-]+", simulated_module.EXAMPLE)
    assert parts
    for part in parts:
        assert parse_simulation(part).devices


@pytest.mark.parametrize(
    ("spec", "quoted"),
    [
        ("", None),
        ("  ", None),
        (",", None),
        ("abc", "abc"),
        ("2xA100", "2xA100"),
        ("2xA100-80TB", "2xA100-80TB"),
        ("1xA100-80GB,junk", "junk"),
        ("-80GB", "-80GB"),
        ("1xA100-80GB:mig=bogus", "bogus"),
        ("1xA100-80GB:mig=1x3g.40gb+", "1xA100-80GB:mig=1x3g.40gb+"),
    ],
)
def test_unreadable_specs_fail_with_an_example(spec: str, quoted: str | None) -> None:
    with pytest.raises(SimulationSpecError) as caught:
        parse_simulation(spec)
    message = str(caught.value)
    # Either the full example of a pool or an example of a MIG layout.
    assert simulated_module.EXAMPLE in message or re.search(r"e\.g\. \d+x\d+g\.\d+gb", message)
    if quoted is not None:
        assert quoted in message


@pytest.mark.parametrize(
    "spec",
    ["0xA100-80GB", "1xA100-0GB", "1xA100-80GB:mig=1x3g.40gb+1x7g.80gb", "1xT4-16GB:mig=2x1g.10gb"],
)
def test_impossible_pools_are_refused_naming_the_item(spec: str) -> None:
    with pytest.raises(SimulationSpecError) as caught:
        parse_simulation(spec)
    assert spec.split(",")[0].split(":")[0] in str(caught.value)


def test_discover_prefers_the_simulated_description(fake_nvml) -> None:
    state = fake_nvml([FakeBoard("GPU-real", "NVIDIA H100", 80 * GiB)])
    inventory = discover("1xT4-16GB")
    assert inventory.simulated
    assert [device.memory_total for device in inventory.devices] == [16 * GiB]
    assert state.init_calls == 0  # NVML is not even asked


@pytest.mark.parametrize("simulate", ["", "   "])
def test_discover_without_a_description_reads_nvml(fake_nvml, simulate: str) -> None:
    fake_nvml([FakeBoard("GPU-real", "NVIDIA H100", 80 * GiB)])
    inventory = discover(simulate)
    assert inventory.source == "nvml"
    assert [device.uuid for device in inventory.devices] == ["GPU-real"]


# ---- NVML -------------------------------------------------------------------------------------
# Boards read through the real pynvml over the simulated C library: test_nvml_library.py. Here,
# what only a fake can say: older drivers and bindings, init failures, a missing pynvml, MIG.


def test_a_driver_without_the_second_memory_call_gives_the_first(fake_nvml) -> None:
    fake_nvml([FakeBoard("GPU-eee", "Tesla T4", 15 * GiB, memory_used=GiB, memory_reserved=None)])
    (device,) = read_nvml_inventory().devices
    assert (device.memory_total, device.memory_used) == (15 * GiB, GiB)


def test_nvml_bytes_from_older_bindings_become_text(fake_nvml) -> None:
    fake_nvml([FakeBoard("GPU-ccc", "Tesla V100", 32 * GiB, as_bytes=True)])
    (device,) = read_nvml_inventory().devices
    assert device.uuid == "GPU-ccc"
    assert device.name == "Tesla V100"


def test_nvml_mig_instances(fake_nvml) -> None:
    fake_nvml(
        [
            FakeBoard(
                "GPU-mig",
                "NVIDIA A100-SXM4-80GB",
                80 * GiB,
                utilization=None,
                mig=[
                    FakeMig("MIG-one", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * GiB - 512 * MiB),
                    None,  # an empty slot
                    FakeMig("MIG-two", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10 * GiB - 256 * MiB),
                ],
            ),
            FakeBoard("GPU-plain", "NVIDIA A100-SXM4-80GB", 80 * GiB),
        ]
    )
    mig_device, plain = read_nvml_inventory().devices
    assert mig_device.mig_enabled
    assert [(m.uuid, m.profile, m.memory_total) for m in mig_device.mig] == [
        ("MIG-one", "3g.40gb", 40 * GiB - 512 * MiB),
        ("MIG-two", "1g.10gb", 10 * GiB - 256 * MiB),
    ]
    assert not plain.mig_enabled


@pytest.mark.parametrize(
    "error",
    ["NVML Shared Library Not Found", "Driver Not Loaded", "Insufficient Permissions"],
)
def test_nvml_that_cannot_start_is_no_gpu_not_a_crash(fake_nvml, error: str) -> None:
    fake_nvml([], init_error=error)
    inventory = read_nvml_inventory()
    assert isinstance(inventory, Inventory)
    assert inventory.source == "none"
    assert inventory.devices == ()
    assert inventory.problem is not None
    assert inventory.problem.startswith("no GPU found")
    assert error in inventory.problem
    # The fix is named: a driver, or a simulated pool.
    assert "JUPYTER_GPUSHARE_SIMULATE" in inventory.problem


def test_missing_pynvml_is_no_gpu_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> object:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml_module, "_nvml", missing)
    inventory = discover("")
    assert inventory.source == "none"
    assert inventory.devices == ()
    assert inventory.problem is not None
    assert inventory.problem.startswith("no GPU found")
    assert "nvidia-ml-py" in inventory.problem


def test_nvml_failing_while_listing_is_no_gpu_and_still_shuts_down(fake_nvml) -> None:
    state = fake_nvml([FakeBoard("GPU-x", "X", GiB)], count_error="Unknown Error")
    inventory = read_nvml_inventory()
    assert inventory.source == "none"
    assert inventory.problem is not None
    assert inventory.problem.startswith("no GPU found")
    assert "Unknown Error" in inventory.problem
    assert state.shutdown_calls == state.init_calls == 1


def test_driver_with_no_board_is_no_gpu(fake_nvml) -> None:
    fake_nvml([])
    inventory = read_nvml_inventory()
    assert inventory.source == "none"
    assert inventory.problem is not None
    assert inventory.problem.startswith("no GPU found")
