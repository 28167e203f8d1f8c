"""The inventory and the usage sampler through the real ``pynvml`` over the simulated NVML library
(tests/support/nvml_sim: ``libnvidia-ml.so.1`` built from C, serving a state file).

Where the Python-level fake (``nvml_fake``) answers what the test says pynvml would, here the
bindings are nvidia-ml-py's own: ctypes structures, versioned entry points (``_v2`` memory,
``_v3`` processes), NVML's two-call size protocol and its return codes, so a change in how we
call pynvml that the real bindings would refuse fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pynvml
import pytest

from jupyter_gpushare.backends.local.inventory import nvml as nvml_module
from jupyter_gpushare.backends.local.inventory import parse_simulation, read_nvml_inventory
from jupyter_gpushare.backends.local.usage.attribution import ProcessUsage
from jupyter_gpushare.backends.local.usage.nvml_usage import read_snapshot
from jupyter_gpushare.core.sizes import GiB, MiB
from tests.support.nvml_sim import (
    STATE_VARIABLE,
    SimulatedCard,
    SimulatedProcess,
    UtilizationSample,
    cards_from_inventory,
    driver_root,
    load_into_pynvml,
    write_state,
)

WriteCards = Callable[[Sequence[SimulatedCard]], Path]


@pytest.fixture
def cards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteCards]:
    """``cards([...])`` makes the simulated driver report those cards (again: the next call
    sees the new ones); the inventory's ``_nvml`` seam returns the real pynvml."""
    load_into_pynvml(pynvml, driver_root())
    state = tmp_path / "nvml-state"
    monkeypatch.setenv(STATE_VARIABLE, str(state))
    monkeypatch.setattr(nvml_module, "_nvml", lambda: pynvml)
    yield lambda boards: write_state(state, boards)
    assert_nvml_shut_down()


def assert_nvml_shut_down() -> None:
    """Every nvmlInit was matched by nvmlShutdown: the library answers Uninitialized again."""
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_nvml_reports_two_boards(cards: WriteCards) -> None:
    cards(
        [
            SimulatedCard("GPU-aaa", "NVIDIA A100-SXM4-80GB", 80 * GiB, memory_used=3 * GiB, utilization=42),
            SimulatedCard("GPU-bbb", "Tesla T4", 15 * GiB + 360 * MiB, utilization=None),
        ]
    )
    inventory = read_nvml_inventory()
    assert (inventory.source, inventory.problem) == ("nvml", None)
    first, second = inventory.devices
    assert (first.index, first.uuid, first.name) == (0, "GPU-aaa", "NVIDIA A100-SXM4-80GB")
    assert (first.memory_total, first.memory_used, first.utilization) == (80 * GiB, 3 * GiB, 42)
    assert (second.index, second.uuid, second.name) == (1, "GPU-bbb", "Tesla T4")
    assert second.memory_total == 15 * GiB + 360 * MiB
    assert second.utilization is None  # NotSupported is unknown, not an error
    assert first.mig == second.mig == ()  # MIG mode off
    assert inventory.details["driver"] == "550.54.15"


def test_what_the_driver_reserves_is_not_offered(cards: WriteCards) -> None:
    # An H200 as NVML reports it (driver 580): 143,771 MiB, 615 MiB of it the driver's own.
    cards(
        [
            SimulatedCard(
                "GPU-ddd", "NVIDIA H200", 143_771 * MiB, memory_used=2 * GiB, memory_reserved=615 * MiB
            )
        ]
    )
    (device,) = read_nvml_inventory().devices
    assert device.memory_total == 143_156 * MiB
    assert device.memory_used == 2 * GiB  # what processes hold, without the reserve


def test_the_simulated_pool_through_nvml_is_the_simulated_pool(cards: WriteCards) -> None:
    pool = parse_simulation("2xA100-80GB,1xT4-16GB")
    cards(cards_from_inventory(pool))
    devices = read_nvml_inventory().devices
    assert [(d.index, d.uuid, d.name, d.memory_total) for d in devices] == [
        (d.index, d.uuid, d.name, d.memory_total) for d in pool.devices
    ]


def test_snapshot_reads_each_device_and_each_process(cards: WriteCards) -> None:
    big = SimulatedCard(
        "GPU-a", "NVIDIA A100-SXM4-80GB", 80 * GiB, memory_used=10 * GiB, utilization=42,
        processes=(SimulatedProcess(101, 3 * GiB), SimulatedProcess(102, None)),
        samples=(UtilizationSample(101, timestamp=10, sm=30), UtilizationSample(102, timestamp=10, sm=5)),
    )  # fmt: skip
    other = SimulatedCard(
        "GPU-b", "Tesla T4", 16 * GiB, memory_used=2 * GiB, utilization=None,  # no samples either
        processes=(SimulatedProcess(101, 1 * GiB), SimulatedProcess(103, 512 * MiB)),
    )  # fmt: skip
    cards([big, other])

    snapshot = read_snapshot(["GPU-a", "GPU-b"])

    assert snapshot.devices == {"GPU-a": (10 * GiB, 42), "GPU-b": (2 * GiB, None)}
    assert snapshot.processes == {
        101: ProcessUsage(memory=4 * GiB, utilization=30),  # summed over both devices
        102: ProcessUsage(memory=0, utilization=5),  # memory the driver hides counts 0
        103: ProcessUsage(memory=512 * MiB, utilization=None),
    }
    # Samples are NVML's since a timestamp: none newer than the last read, no utilisation.
    assert read_snapshot(["GPU-a"], since=10).processes[101].utilization is None


def test_the_next_call_sees_what_the_simulation_wrote(cards: WriteCards) -> None:
    card = SimulatedCard("GPU-a", "NVIDIA H200", 140 * GiB)
    cards([card])
    assert read_snapshot(["GPU-a"]).processes == {}
    cards(
        [
            SimulatedCard(
                "GPU-a", "NVIDIA H200", 140 * GiB, memory_used=GiB, processes=(SimulatedProcess(7, GiB),)
            )
        ]
    )
    assert read_snapshot(["GPU-a"]).processes == {7: ProcessUsage(GiB, None)}


def test_a_process_started_with_its_environment_finds_the_library(tmp_path: Path) -> None:
    """How a server, a kernel or a container finds it: by name, on LD_LIBRARY_PATH."""
    state = write_state(tmp_path / "state", [SimulatedCard("GPU-env", "NVIDIA H200", 140 * GiB)])
    code = (
        "from jupyter_gpushare.backends.local.inventory.nvml import read_nvml_inventory as read; "
        "print([d.uuid for d in read().devices])"
    )
    env = {**os.environ, **driver_root().environment(state)}
    answer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert answer.stdout.strip() == "['GPU-env']"


def test_a_card_gone_from_the_pool_fails_the_snapshot_and_nvml_still_shuts_down(cards: WriteCards) -> None:
    cards([SimulatedCard("GPU-a", "A", 8 * GiB)])
    with pytest.raises(pynvml.NVMLError_NotFound):
        read_snapshot(["GPU-a", "GPU-vanished"])


def test_without_the_driver_there_is_no_gpu_naming_it(
    cards: WriteCards, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_VARIABLE, "/nonexistent/nvml-state")
    inventory = read_nvml_inventory()
    assert (inventory.source, inventory.devices) == ("none", ())
    assert inventory.problem is not None
    assert "Driver Not Loaded" in inventory.problem  # pynvml's words for NVML's return code


def test_what_a_simulated_board_lacks_is_not_supported(cards: WriteCards) -> None:
    cards([SimulatedCard("GPU-a", "A", 8 * GiB)])
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # not an entry point at all
            pynvml.nvmlDeviceGetFanSpeed(handle)
        assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    finally:
        pynvml.nvmlShutdown()


def test_a_malformed_state_is_refused_with_its_line(
    cards: WriteCards, capfd: pytest.CaptureFixture[str]
) -> None:
    state = cards([SimulatedCard("GPU-a", "A", 8 * GiB)])
    state.write_text("nvml-sim\t1\ngpu\tGPU-a\tA\tmany\n")
    inventory = read_nvml_inventory()
    assert inventory.problem is not None and "Driver Not Loaded" in inventory.problem
    assert f"{state}:2: not a record of the nvml-sim 1 format" in capfd.readouterr().err


# ---- what a container sees: NVIDIA_VISIBLE_DEVICES ------------------------------------------------

THREE_CARDS = [
    SimulatedCard("GPU-a", "NVIDIA H200", 140 * GiB, memory_used=GiB, processes=(SimulatedProcess(11, GiB),)),
    SimulatedCard("GPU-b", "NVIDIA H200", 140 * GiB, memory_used=GiB, processes=(SimulatedProcess(22, GiB),)),
    SimulatedCard(
        "GPU-c", "NVIDIA H200", 140 * GiB, memory_used=3 * GiB, utilization=60,
        processes=(SimulatedProcess(33, 3 * GiB),), samples=(UtilizationSample(33, timestamp=5, sm=60),),
    ),
]  # fmt: skip


def visible_uuids() -> list[str]:
    pynvml.nvmlInit()
    try:
        return [
            pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def test_a_container_sees_only_the_cards_it_was_given_renumbered(
    cards: WriteCards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UUIDs or the state's indexes, in the variable's order: the third card is the container's
    first, as the container toolkit's device injection would show it."""
    cards(THREE_CARDS)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-c,0")
    inventory = read_nvml_inventory()
    assert [(d.index, d.uuid, d.memory_used, d.utilization) for d in inventory.devices] == [
        (0, "GPU-c", 3 * GiB, 60),
        (1, "GPU-a", GiB, 0),
    ]
    # The hidden card is not found; the shown ones keep their processes (by the host's PIDs)
    # and samples, and NVML gives them their new indexes.
    snapshot = read_snapshot(["GPU-c", "GPU-a"])
    assert snapshot.processes == {33: ProcessUsage(3 * GiB, 60), 11: ProcessUsage(GiB, None)}
    with pytest.raises(pynvml.NVMLError_NotFound):
        read_snapshot(["GPU-b"])
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID("GPU-c")) == 0
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("all", ["GPU-a", "GPU-b", "GPU-c"]),
        ("GPU-b", ["GPU-b"]),
        ("2,GPU-c,1", ["GPU-c", "GPU-b"]),  # a card named twice is one device
        ("none", []),  # the driver without a device: nvmlInit succeeds, nothing to see
        ("void", []),
        ("", []),
    ],
)
def test_the_variable_selects_as_the_container_toolkit_does(
    cards: WriteCards, monkeypatch: pytest.MonkeyPatch, visible: str, expected: list[str]
) -> None:
    cards(THREE_CARDS)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", visible)
    assert visible_uuids() == expected


def test_without_the_variable_every_card_is_seen_as_by_the_device_plugin(
    cards: WriteCards, monkeypatch: pytest.MonkeyPatch
) -> None:
    cards(THREE_CARDS)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-b")
    assert visible_uuids() == ["GPU-b"]
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES")  # the next call serves the host's view again
    assert visible_uuids() == ["GPU-a", "GPU-b", "GPU-c"]


def test_a_device_that_is_no_card_is_no_driver_with_its_name(
    cards: WriteCards, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    state = cards(THREE_CARDS)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-a,3")
    inventory = read_nvml_inventory()
    assert inventory.problem is not None and "Driver Not Loaded" in inventory.problem
    assert (
        'NVIDIA_VISIBLE_DEVICES names "3", which is neither the UUID nor the index of a card of '
        f"{state}" in capfd.readouterr().err
    )


def test_a_process_started_with_the_variable_sees_its_one_card(tmp_path: Path) -> None:
    """A kernel in a container the toolkit gave one card: its own process, pynvml by name."""
    state = write_state(tmp_path / "state", THREE_CARDS)
    code = (
        "from jupyter_gpushare.backends.local.inventory.nvml import read_nvml_inventory as read; "
        "print([(d.index, d.uuid) for d in read().devices])"
    )
    env = {**os.environ, **driver_root().environment(state), "NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    answer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert answer.stdout.strip() == "[(0, 'GPU-b')]"
