"""gpushare kernelspecs (docs/admins/configuration.md): what kernel.json says, and installing them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpushare.config.kernelspecs import build_kernelspec, install_kernelspecs, kernelspec_name
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS, SizeError


def provisioner(spec: dict) -> dict:
    return spec["metadata"]["kernel_provisioner"]


@pytest.mark.parametrize(
    ("size", "mode", "cores"),
    [("4G", "timeslice", None), ("512M", "mps", 30), ("25%", "vgpu", None), ("whole", "exclusive", None)],
)
def test_kernelspec_asks_the_gpushare_provisioner_for_the_slice(
    size: str, mode: str, cores: int | None
) -> None:
    spec = build_kernelspec(size, mode, cores)
    assert provisioner(spec)["provisioner_name"] == "gpushare-provisioner"
    assert provisioner(spec)["config"] == {"gpu_memory": size, "gpu_mode": mode, "gpu_cores": cores}
    assert spec["language"] == "python"
    assert "{connection_file}" in spec["argv"]
    assert "{" not in spec["display_name"]  # every placeholder filled


def test_the_spec_example() -> None:
    spec = build_kernelspec("4G")
    # (Two hair spaces pad the number, so that the launcher orders sizes by size.)
    assert spec["display_name"] == "Python 3 (GPU \u200a\u200a4G)"
    assert spec["display_name"].replace("\u200a", "") == "Python 3 (GPU 4G)"
    # Frozen modules off, as in ipykernel's own kernelspec: else debugpy warns at every start.
    assert spec["argv"] == [
        "python",
        "-Xfrozen_modules=off",
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    assert provisioner(spec)["config"] == {"gpu_memory": "4G", "gpu_mode": "timeslice", "gpu_cores": None}


def test_display_names_tell_sizes_and_modes_apart() -> None:
    names = {
        build_kernelspec(size, mode)["display_name"]
        for size in ("2G", "4G", "whole")
        for mode in ("timeslice", "vgpu")
    }
    assert len(names) == 6
    assert "vgpu" in build_kernelspec("4G", "vgpu")["display_name"]


def test_the_kernelspec_that_asks_has_no_size_of_its_own() -> None:
    spec = build_kernelspec(None)
    assert spec["display_name"] == "Python 3 (GPU)"
    assert provisioner(spec)["config"] == {"gpu_memory": None, "gpu_mode": "timeslice", "gpu_cores": None}
    assert kernelspec_name(None, "timeslice") == "python3-gpu"
    assert build_kernelspec(None, "vgpu")["display_name"] == "Python 3 (GPU, vgpu)"


def test_installed_sizes_sort_by_size_as_text_and_carry_the_gpu_logo(tmp_path: Path) -> None:
    installed = install_kernelspecs(["16G", "2G", "8G", "whole"], prefix=str(tmp_path), asking=True)
    names = [json.loads((Path(d) / "kernel.json").read_text())["display_name"] for _, d in installed]
    assert names[0] == "Python 3 (GPU)"
    assert names[2] == "Python 3 (GPU \u200a\u200a2G)"  # hair spaces, all but invisible
    # JupyterLab's launcher orders cards by display name with JavaScript's localeCompare, whose
    # collation puts white space (a hair space too) before digits, as ASCII puts " ".
    collated = sorted(names[1:], key=lambda name: name.replace("\u200a", " "))
    assert collated == [names[2], names[3], names[1], names[4]]
    for _, directory in installed:
        assert "<svg" in (Path(directory) / "logo-svg.svg").read_text()


def test_building_does_not_change_the_next_spec() -> None:
    build_kernelspec("2G", "mps", 10)
    assert provisioner(build_kernelspec("8G"))["config"]["gpu_memory"] == "8G"


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("abc", "accepted forms"),
        ("0", "must be more than zero"),
        ("-4G", "more than zero"),
        ("10T", "accepted forms"),
    ],
)
def test_a_bad_size_builds_nothing(size: str, said: str) -> None:
    with pytest.raises(SizeError, match=said):
        build_kernelspec(size)


def test_a_bad_mode_builds_nothing() -> None:
    with pytest.raises(ValueError, match="bogus"):
        build_kernelspec("4G", "bogus")


@pytest.mark.parametrize(
    ("size", "mode", "name"),
    [
        ("4G", "timeslice", "python3-gpu-4g"),
        ("0.5G", "timeslice", "python3-gpu-0-5g"),
        ("512MiB", "timeslice", "python3-gpu-512mib"),
        ("25%", "timeslice", "python3-gpu-25pct"),
        ("whole", "timeslice", "python3-gpu-whole"),
        ("4G", "vgpu", "python3-gpu-4g-vgpu"),
    ],
)
def test_kernelspec_names(size: str, mode: str, name: str) -> None:
    assert kernelspec_name(size, mode) == name


@pytest.mark.parametrize("size", ["4G", "0.5G", "25%", "512 MiB", "whole", "4096"])
def test_kernelspec_names_are_valid_jupyter_kernel_names(size: str) -> None:
    from jupyter_client.kernelspec import _is_valid_kernel_name

    assert _is_valid_kernel_name(kernelspec_name(size, "mps"))


def test_install_into_a_prefix(tmp_path: Path) -> None:
    installed = install_kernelspecs(["2G", "whole"], "vgpu", prefix=str(tmp_path))
    assert [name for name, _ in installed] == ["python3-gpu-2g-vgpu", "python3-gpu-whole-vgpu"]
    for (name, directory), size in zip(installed, ["2G", "whole"], strict=True):
        assert Path(directory) == tmp_path / "share" / "jupyter" / "kernels" / name
        spec = json.loads((Path(directory) / "kernel.json").read_text())
        assert provisioner(spec)["provisioner_name"] == "gpushare-provisioner"
        assert provisioner(spec)["config"]["gpu_memory"] == size
        assert provisioner(spec)["config"]["gpu_mode"] == "vgpu"
    # jupyter_client finds them there.
    manager = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    found = manager.get_kernel_spec("python3-gpu-2g-vgpu")
    assert found.metadata["kernel_provisioner"]["config"]["gpu_memory"] == "2G"


def test_a_bad_size_among_good_ones_installs_nothing(tmp_path: Path) -> None:
    with pytest.raises(SizeError) as caught:
        install_kernelspecs(["2G", "abc", "4G"], prefix=str(tmp_path))
    assert ACCEPTED_FORMS in str(caught.value)
    assert list(tmp_path.rglob("kernel.json")) == []
