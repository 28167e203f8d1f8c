"""The container toolkit's stand-in (tests/cluster/nvidia_runtime.py): how it reads runc's command
line and edits a bundle's spec, and a container runc really creates through it, whose process
loads the simulated NVML by name and sees only the card ``NVIDIA_VISIBLE_DEVICES`` names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..cluster.nvidia_runtime import (
    CONTAINER_LIBRARY,
    CONTAINER_STATE_DIRECTORY,
    NvidiaRuntime,
    bundle_of,
    containerd_options,
    prepare,
    with_nvml,
)
from ..support.nvml_sim import SimulatedCard, driver_root, write_state

LIBRARY, STATE = "/drivers/libnvidia-ml.so.1", "/var/nvml/state"
MOUNTS = [
    {
        "destination": CONTAINER_LIBRARY,
        "type": "bind",
        "source": LIBRARY,
        "options": ["bind", "ro", "nosuid", "nodev"],
    },
    {
        "destination": CONTAINER_STATE_DIRECTORY,
        "type": "bind",
        "source": "/var/nvml",  # the directory: the state is replaced by a rename
        "options": ["bind", "ro", "nosuid", "nodev"],
    },
]
PROC = {"destination": "/proc", "type": "proc", "source": "proc"}


def spec(*env: str) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin", *env]}, "mounts": [PROC]}


# ---- runc's command line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "bundle"),
    [
        # As containerd's runc shim (go-runc) calls it.
        (
            [
                "--root",
                "/r",
                "--log",
                "/l.json",
                "--log-format",
                "json",
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/b/init.pid",
                "c1",
            ],
            "/b",
        ),
        (["--root=/r", "create", "-b", "/b", "c1"], "/b"),
        (["-root", "/r", "create", "--bundle=/b", "c1"], "/b"),
        (["--debug", "--systemd-cgroup", "run", "--bundle", "rel", "c1"], "rel"),
        (["--root", "/r", "create", "c1"], "/cwd"),  # runc's default bundle: the working directory
        (["--root", "/r", "start", "c1"], None),
        (["--root", "/r", "delete", "--force", "c1"], None),
        (["--root", "create", "state", "c1"], None),  # "create" is the root's value here
        (["exec", "--process", "/p.json", "c1"], None),
        ([], None),
    ],
)
def test_the_bundle_is_found_only_where_a_container_is_created(args: list[str], bundle: str | None) -> None:
    assert bundle_of(args, "/cwd") == bundle


# ---- the spec --------------------------------------------------------------------------------------


def test_a_container_given_a_card_gets_the_library_the_state_and_its_path() -> None:
    original = spec("NVIDIA_VISIBLE_DEVICES=GPU-b", "GPUSHARE_NVML_STATE=/elsewhere", "HOME=/root")
    before = json.dumps(original)
    edited = with_nvml(original, LIBRARY, STATE)
    assert edited is not None
    assert edited["mounts"] == [PROC, *MOUNTS]
    assert edited["process"]["env"] == [
        "PATH=/bin",
        "NVIDIA_VISIBLE_DEVICES=GPU-b",
        "HOME=/root",
        f"GPUSHARE_NVML_STATE={CONTAINER_STATE_DIRECTORY}/state",  # the runtime's, not the pod's
    ]
    assert edited["process"]["args"] == ["sh"]
    assert json.dumps(original) == before  # a new spec: the one given is untouched
    assert with_nvml(edited, LIBRARY, STATE) == edited  # twice is once: no mount repeated


NO_DEVICE = [
    (),
    ("NVIDIA_VISIBLE_DEVICES=void",),
    ("NVIDIA_VISIBLE_DEVICES=none",),
    ("NVIDIA_VISIBLE_DEVICES=",),
    ("NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES=void"),
]


@pytest.mark.parametrize("env", NO_DEVICE)
def test_a_container_asking_no_device_is_left_alone(env: tuple[str, ...]) -> None:
    """As the toolkit: no variable, void, none or empty (the last value counts, as runc sets it)."""
    assert with_nvml(spec(*env), LIBRARY, STATE) is None


def test_prepare_edits_the_bundle_of_a_create_only(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec("NVIDIA_VISIBLE_DEVICES=all")))
    config = {"library": LIBRARY, "state": STATE}
    prepare(["--root", "/r", "start", "c1"], config, str(tmp_path))
    assert json.loads((bundle / "config.json").read_text())["mounts"] == [PROC]
    prepare(["--root", "/r", "create", "--bundle", "bundle", "c1"], config, str(tmp_path))
    assert json.loads((bundle / "config.json").read_text())["mounts"] == [PROC, *MOUNTS]


def test_the_state_s_directory_must_hold_the_state_alone(tmp_path: Path) -> None:
    """It is mounted into every GPU container: a token beside the state would be too."""
    state = write_state(tmp_path / "nvml" / "state", [SimulatedCard("GPU-a", "A", 1 << 30)])
    (state.parent / "kubeconfig").write_text("secret")
    with pytest.raises(ValueError, match=r"must hold the NVML state alone, and it also holds kubeconfig"):
        NvidiaRuntime(driver_root().library, state).install(tmp_path / "runtime")
    assert not (tmp_path / "runtime").exists()


def test_containerd_runs_the_launcher_as_runc(tmp_path: Path) -> None:
    state = write_state(tmp_path / "nvml" / "state", [SimulatedCard("GPU-a", "A", 1 << 30)])
    launcher = NvidiaRuntime(driver_root().library, state).install(tmp_path / "runtime")
    assert containerd_options(launcher) == f'  BinaryName = "{launcher}"\n'
    config = json.loads((tmp_path / "runtime" / "nvidia-runtime.json").read_text())
    assert config == {
        "runc": shutil.which("runc"),
        "library": str(driver_root().library),
        "state": str(state),
    }


# ---- a real container -------------------------------------------------------------------------------

# A container's process loading NVML by name: it prints the cards it sees whenever they change and
# ends once a card's name says "done" (a C program, so the image is the loader and libc alone).
PROBE = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
typedef int (*init_t)(void);
typedef int (*count_t)(unsigned int *);
typedef int (*handle_t)(unsigned int, void **);
typedef int (*text_t)(void *, char *, unsigned int);
int main(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nvml == NULL) { printf("%s\n", dlerror()); return 1; }
    count_t count = (count_t)dlsym(nvml, "nvmlDeviceGetCount_v2");
    handle_t handle = (handle_t)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    text_t uuid = (text_t)dlsym(nvml, "nvmlDeviceGetUUID"), name = (text_t)dlsym(nvml, "nvmlDeviceGetName");
    if (((init_t)dlsym(nvml, "nvmlInit_v2"))() != 0) { printf("nvmlInit failed\n"); return 1; }
    char last[1024] = "", now[1024];
    const struct timespec pause = {0, 50 * 1000 * 1000};
    for (int round = 0; round < 2400; round++) {
        unsigned int n = 0;
        now[0] = '\0';
        count(&n);
        for (unsigned int i = 0; i < n; i++) {
            void *h; char u[96], m[96];
            handle(i, &h); uuid(h, u, sizeof u); name(h, m, sizeof m);
            snprintf(now + strlen(now), sizeof now - strlen(now), "%u %s %s;", i, u, m);
        }
        if (strcmp(now, last) != 0) { printf("%s\n", now); fflush(stdout); strcpy(last, now); }
        if (strstr(now, "done") != NULL) return 0;
        nanosleep(&pause, NULL);
    }
    return 2;
}
"""


def image(rootfs: Path, probe: Path) -> None:
    """A merged-/usr Debian layout with the loader, libc and the probe: no ld.so.cache at all."""
    libraries = rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    libraries.mkdir(parents=True)
    (rootfs / "usr" / "lib64").mkdir()
    shutil.copy(Path("/lib/x86_64-linux-gnu/libc.so.6").resolve(), libraries / "libc.so.6")
    shutil.copy(
        Path("/lib64/ld-linux-x86-64.so.2").resolve(), rootfs / "usr" / "lib64" / "ld-linux-x86-64.so.2"
    )
    (rootfs / "lib").symlink_to("usr/lib")
    (rootfs / "lib64").symlink_to("usr/lib64")
    shutil.copy(probe, rootfs / "probe")


@pytest.fixture
def bundle(tmp_path: Path) -> Iterator[Path]:
    """A runc bundle running the probe (runc's own default spec), and runc's root beside it."""
    probe = tmp_path / "probe"
    (tmp_path / "probe.c").write_text(PROBE)
    subprocess.run(["gcc", "-O2", "-o", str(probe), str(tmp_path / "probe.c")], check=True)
    directory = tmp_path / "bundle"
    image(directory / "rootfs", probe)
    subprocess.run(["runc", "spec"], cwd=directory, check=True)
    yield directory


def run_container(launcher: Path, bundle: Path, env: list[str]) -> subprocess.Popen[str]:
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(terminal=False, args=["/probe"], env=[*config["process"]["env"], *env])
    (bundle / "config.json").write_text(json.dumps(config))
    name = f"nvidia-runtime-{uuid.uuid4().hex[:8]}"
    command = [str(launcher), "--root", str(bundle.parent / "runc"), "run", "--bundle", str(bundle), name]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.integration
def test_a_container_runc_creates_through_the_wrapper_sees_its_card(tmp_path: Path, bundle: Path) -> None:
    """The library loads by name from /usr/lib/x86_64-linux-gnu (no ldconfig), serves the one card
    named, and a state replaced by a rename reaches the running container."""
    cards = [SimulatedCard("GPU-a", "A", 1 << 30), SimulatedCard("GPU-b", "B", 1 << 30)]
    state = write_state(tmp_path / "nvml" / "state", cards)
    launcher = NvidiaRuntime(driver_root().library, state).install(tmp_path / "runtime")
    container = run_container(launcher, bundle, ["NVIDIA_VISIBLE_DEVICES=GPU-b"])
    try:
        assert container.stdout is not None
        assert container.stdout.readline() == "0 GPU-b B;\n"
        write_state(state, [cards[0], SimulatedCard("GPU-b", "B done", 1 << 30)])
        assert container.stdout.readline() == "0 GPU-b B done;\n"
        assert container.wait(timeout=120) == 0
    finally:
        container.kill()
        container.wait()


@pytest.mark.integration
def test_a_container_asking_no_card_gets_no_library(tmp_path: Path, bundle: Path) -> None:
    state = write_state(tmp_path / "nvml" / "state", [SimulatedCard("GPU-a", "A", 1 << 30)])
    launcher = NvidiaRuntime(driver_root().library, state).install(tmp_path / "runtime")
    container = run_container(launcher, bundle, ["NVIDIA_VISIBLE_DEVICES=void"])
    output, _ = container.communicate(timeout=120)
    assert container.returncode == 1
    assert "libnvidia-ml.so.1: cannot open shared object file" in output
