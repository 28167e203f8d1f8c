"""Sharing modes: the environment a kernel gets, and what a node must offer for each mode."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.backends.local.inventory import Inventory, parse_simulation
from jupyter_gpushare.core.devices import Device
from jupyter_gpushare.core.framework_budget import framework_budget
from jupyter_gpushare.core.modes import MODES, Grant, NodeFacts, UnknownModeError, get_mode, probe_node

GiB = 2**30
MiB = 2**20

CAPPED_MODES = ["timeslice", "mps", "vgpu", "mig"]  # the modes that share a device or an instance
REAL_NODE = NodeFacts(simulated=False, has_devices=True)


def grant(mode: str, memory: int = 20 * GiB, unit_memory: int = 80 * GiB, cores: int | None = None) -> Grant:
    return Grant(
        kernel_id="kernel-1",
        mode=mode,
        unit_uuid="GPU-1234",
        unit_memory=unit_memory,
        memory=memory,
        cores=cores,
    )


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_names_the_device_the_slice_and_the_mode(mode: str) -> None:
    env = get_mode(mode).kernel_env(grant(mode, memory=6 * GiB + 5), NodeFacts(simulated=True))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1234"
    assert env["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(6 * GiB + 5)
    assert env["JUPYTER_GPUSHARE_MODE"] == mode
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in env.items())


@pytest.mark.parametrize("mode", CAPPED_MODES)
def test_shared_modes_cap_the_frameworks(mode: str) -> None:
    env = get_mode(mode).kernel_env(
        grant(mode, memory=20 * GiB, unit_memory=80 * GiB), NodeFacts(simulated=True)
    )
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    # The 20G slice less the CUDA context allowance (NVML counts the context; the caps do not).
    assert Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == Decimal("0.2406")
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(20 * GiB - 768 * MiB)
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


@pytest.mark.parametrize(
    ("memory", "unit_memory", "fraction"),
    # Of the slice less its CUDA context allowance: 4G - 768M = 3328M, 3328/6144 = 0.54166...
    [
        (4 * GiB, 6 * GiB, "0.5416"),
        (4 * GiB, 12 * GiB, "0.2708"),
        (80 * GiB, 80 * GiB, "0.9906"),
        (MiB, 80 * GiB, "0"),
    ],
)
def test_the_jax_fraction_is_rounded_down(memory: int, unit_memory: int, fraction: str) -> None:
    env = get_mode("timeslice").kernel_env(grant("timeslice", memory, unit_memory), REAL_NODE)
    assert Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == Decimal(fraction)


@given(
    mode=st.sampled_from(CAPPED_MODES),
    unit_memory=st.integers(MiB, 200 * GiB),
    data=st.data(),
)
def test_no_cap_ever_allows_more_than_the_slice(mode: str, unit_memory: int, data: st.DataObject) -> None:
    memory = data.draw(st.integers(1, unit_memory))
    env = get_mode(mode).kernel_env(grant(mode, memory, unit_memory, cores=50), NodeFacts(simulated=True))
    fraction = Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    assert fraction * unit_memory <= memory
    # ...and is not needlessly small: rounded down to the 4th decimal at most.
    assert (fraction + Decimal("0.0001")) * unit_memory > framework_budget(memory)
    assert int(env["CUPY_GPU_MEMORY_LIMIT"]) == framework_budget(memory) <= memory
    if mode == "mps":
        ordinal, limit = env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")
        assert ordinal == "0"
        assert limit.endswith("M") and int(limit[:-1]) * MiB <= memory
    if mode == "vgpu":
        limit = env["CUDA_DEVICE_MEMORY_LIMIT"]
        assert limit.endswith("m") and int(limit[:-1]) * MiB <= memory


def test_timeslice_has_no_hard_limits() -> None:
    env = get_mode("timeslice").kernel_env(grant("timeslice", cores=30), REAL_NODE)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in env
    assert "LD_PRELOAD" not in env


def test_mps_pins_memory_and_threads() -> None:
    facts = NodeFacts(mps_pipe_directory="/run/mps")
    env = get_mode("mps").kernel_env(grant("mps", memory=20 * GiB, cores=30), facts)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    without_cores = get_mode("mps").kernel_env(grant("mps", memory=20 * GiB + MiB - 1), facts)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in without_cores
    assert without_cores["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # rounded down


def test_vgpu_preloads_hami_core_with_memory_in_mib_and_an_sm_limit(tmp_path: Path) -> None:
    facts = NodeFacts(libvgpu_path="/opt/hami/libvgpu.so", vgpu_cache_directory=str(tmp_path))
    env = get_mode("vgpu").kernel_env(grant("vgpu", memory=8 * GiB, cores=25), facts)
    assert env["LD_PRELOAD"] == "/opt/hami/libvgpu.so"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
    # Per-kernel accounting file, inside the configured directory.
    cache = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert Path(cache).parent == tmp_path
    assert "kernel-1" in cache


def test_vgpu_cache_files_of_two_kernels_differ() -> None:
    facts = NodeFacts(simulated=True)
    first = get_mode("vgpu").kernel_env(grant("vgpu"), facts)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    other = Grant("kernel-2", "vgpu", "GPU-1234", 80 * GiB, 20 * GiB)
    assert get_mode("vgpu").kernel_env(other, facts)["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != first


def test_vgpu_without_the_library_preloads_nothing_and_sets_no_sm_limit_without_cores() -> None:
    env = get_mode("vgpu").kernel_env(grant("vgpu"), NodeFacts(simulated=True))
    assert "LD_PRELOAD" not in env
    assert "CUDA_DEVICE_SM_LIMIT" not in env


def test_cores_are_passed_on_for_every_mode() -> None:
    for name, mode in MODES.items():
        env = mode.kernel_env(grant(name, cores=40), NodeFacts(simulated=True))
        assert env["JUPYTER_GPUSHARE_CORES"] == "40"
        assert "JUPYTER_GPUSHARE_CORES" not in mode.kernel_env(grant(name), NodeFacts(simulated=True))


# ---- what a node must offer -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "facts", "missing_words"),
    [
        ("mps", REAL_NODE, "nvidia-cuda-mps-control"),
        ("vgpu", REAL_NODE, "libvgpu_path"),
        ("mig", REAL_NODE, "MIG"),
        ("mig", NodeFacts(simulated=True), "MIG"),  # a simulated pool without MIG has no instances
    ],
)
def test_a_mode_the_node_cannot_honour_says_what_is_missing(
    mode: str, facts: NodeFacts, missing_words: str
) -> None:
    reason = get_mode(mode).unavailable_reason(facts)
    assert reason is not None
    assert missing_words in reason


@pytest.mark.parametrize(
    ("mode", "facts"),
    [
        ("exclusive", REAL_NODE),
        ("timeslice", REAL_NODE),
        ("mps", NodeFacts(simulated=True)),
        ("mps", NodeFacts(mps_pipe_directory="/tmp/nvidia-mps")),
        ("vgpu", NodeFacts(simulated=True)),
        ("vgpu", NodeFacts(libvgpu_path="/usr/lib/libvgpu.so")),
        ("mig", NodeFacts(mig_instances=2)),
    ],
)
def test_a_mode_the_node_can_honour(mode: str, facts: NodeFacts) -> None:
    assert get_mode(mode).unavailable_reason(facts) is None


def real_inventory() -> Inventory:
    device = Device(0, "GPU-real", "NVIDIA A100", 80 * GiB)
    return Inventory(devices=(device,), source="nvml")


def test_probe_finds_an_mps_daemon_by_its_control_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "control")
    facts = probe_node(real_inventory(), mps_pipe_directory=str(tmp_path))
    assert facts.mps_pipe_directory == str(tmp_path)
    assert get_mode("mps").unavailable_reason(facts) is None
    env = get_mode("mps").kernel_env(grant("mps"), facts)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)


def test_probe_reads_the_mps_pipe_directory_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(tmp_path / "control")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert probe_node(real_inventory()).mps_pipe_directory == str(tmp_path)


@pytest.mark.parametrize("what", ["nothing", "regular file", "directory"])
def test_probe_without_a_control_fifo_means_no_mps(tmp_path: Path, what: str) -> None:
    if what == "regular file":
        (tmp_path / "control").write_text("")
    elif what == "directory":
        (tmp_path / "control").mkdir()
    facts = probe_node(real_inventory(), mps_pipe_directory=str(tmp_path))
    assert facts.mps_pipe_directory is None
    assert get_mode("mps").unavailable_reason(facts) is not None


def test_probe_accepts_libvgpu_only_when_the_file_exists(tmp_path: Path) -> None:
    library = tmp_path / "libvgpu.so"
    missing = probe_node(real_inventory(), libvgpu_path=str(library))
    assert missing.libvgpu_path is None
    assert get_mode("vgpu").unavailable_reason(missing) is not None
    library.write_bytes(b"\x7fELF")
    present = probe_node(real_inventory(), libvgpu_path=str(library))
    assert present.libvgpu_path == str(library)
    assert get_mode("vgpu").unavailable_reason(present) is None
    assert get_mode("vgpu").kernel_env(grant("vgpu"), present)["LD_PRELOAD"] == str(library)
    # A directory is not a library.
    assert probe_node(real_inventory(), libvgpu_path=str(tmp_path)).libvgpu_path is None


def test_probe_counts_mig_instances_and_knows_a_simulated_pool() -> None:
    facts = probe_node(parse_simulation("1xA100-80GB:mig=1x3g.40gb+2x1g.10gb,1xA100-80GB:mig=7x1g.10gb"))
    assert facts.simulated
    assert facts.has_devices
    assert facts.mig_instances == 10
    assert get_mode("mig").unavailable_reason(facts) is None


def test_probe_of_an_empty_node() -> None:
    facts = probe_node(Inventory(devices=(), source="none", problem="no GPU found: nothing"))
    assert not facts.has_devices
    assert not facts.simulated
    assert facts.mig_instances == 0


@pytest.mark.parametrize("name", ["bogus", "MPS", "", None, ["mps"]])
def test_unknown_modes_are_refused_listing_the_known_ones(name: object) -> None:
    with pytest.raises(UnknownModeError) as caught:
        get_mode(name)  # type: ignore[arg-type]
    for known in MODES:
        assert known in str(caught.value)


def test_mode_names_match_the_spec_table() -> None:
    assert set(MODES) == {"exclusive", "timeslice", "mps", "vgpu", "mig"}
    assert all(get_mode(name).name == name for name in MODES)
