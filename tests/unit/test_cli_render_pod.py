"""``jupyter gpushare render-pod``: prints exactly the pod the backend builds, follows the
server's configuration, a kernelspec and flags, and refuses bad input with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_gpushare.backends.kubernetes.objects.build import DEFAULT_ARGV, cluster_facts, kernel_pod
from jupyter_gpushare.cli import main
from jupyter_gpushare.config import load_settings
from jupyter_gpushare.config.kernelspecs import install_kernelspecs
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS
from jupyter_gpushare.core.slice_request import make_slice_request
from tests.support.k8s_pods import (
    container,
    env_of,
    validate,
)


def rendered(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["render-pod", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ")
    return dict(yaml.safe_load(out))


def expected_render(
    memory: str, mode: str, cores: int | None = None, argv: Any = DEFAULT_ARGV
) -> dict[str, Any]:
    gpushare = load_settings()
    owner = gpushare.effective_owner()
    pod, _ = kernel_pod(
        gpushare,
        kernel_id="00000000-0000-4000-8000-000000000000",
        server_id=f"{owner}@render-pod",
        owner=owner,
        request=make_slice_request(memory, mode, cores, gpushare.default_memory, gpushare.default_mode),
        cluster=cluster_facts(gpushare),
        argv=argv,
    )
    return pod


def test_render_pod_prints_exactly_what_kernel_pod_builds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_PRESET", "hami")
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "alice")
    pod = rendered(capsys, "--memory", "6G", "--mode", "vgpu", "--cores", "30")
    assert pod == expected_render("6G", "vgpu", 30)
    assert container(pod)["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144", "nvidia.com/gpucores": "30"}
    }
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    validate(pod)


def test_render_pod_follows_the_server_config_and_the_preset_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import os
    from pathlib import Path

    config = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {"GPUShare": {"namespace": "notebooks", "pod_template": {"spec": {"priorityClassName": "nb"}}}}
        )
    )
    pod = rendered(capsys, "--memory", "6G", "--mode", "vgpu", "--preset", "aliyun")
    assert container(pod)["resources"] == {"limits": {"aliyun.com/gpu-mem": "6"}}
    assert pod["metadata"]["namespace"] == "notebooks"
    assert pod["spec"]["priorityClassName"] == "nb"
    validate(pod)


def test_render_pod_takes_the_request_and_argv_from_a_kernelspec(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    [(name, directory)] = install_kernelspecs(["8G"], "mps", user=True)
    argv = json.loads((Path(directory) / "kernel.json").read_text())["argv"]
    assert argv != list(DEFAULT_ARGV)  # (its Python options: frozen modules off)
    pod = rendered(capsys, "--kernelspec", name)
    assert pod == expected_render("8G", "mps", argv=argv)
    assert env_of(pod)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    # Flags win over the kernelspec.
    assert rendered(capsys, "--kernelspec", name, "--memory", "2G") == expected_render("2G", "mps", argv=argv)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "0G"], "must be more than zero"),
        (["--memory", "lots"], ACCEPTED_FORMS),
        (["--memory", "4G", "--cores", "500"], "gpu_cores must be from 1 to 100"),
        (["--memory", "25%", "--mode", "timeslice"], "needs the cards' memory"),
        (["--memory", "6G", "--mode", "mig"], "mode 'mig' needs MIG profiles"),
        (["--memory", "6G", "--mode", "vgpu", "--preset", "kai", "--cores", "30"], "cannot limit GPU cores"),
        (["--kernelspec", "no-such-kernel"], "no kernelspec named 'no-such-kernel'"),
    ],
)
def test_render_pod_rejects_bad_input_with_exit_2_and_the_reason(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["render-pod", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("jupyter gpushare: error: ")
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_render_pod_rejects_an_unknown_mode_through_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["render-pod", "--mode", "turbo"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'turbo'" in capsys.readouterr().err


def test_render_pod_reports_a_bad_resource_names_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_RESOURCE_NAMES", '{"timeslice": "nvidia.com/gpu.shared"}')
    assert main(["render-pod", "--memory", "4G"]) == 2
    assert "unknown resource name field(s) timeslice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("preset", "mode", "consumable", "warned"),
    [
        ("nvidia-dra", "mps", None, True),  # issue 25: each kernel would hold a whole card, unsaid
        ("nvidia-dra", "timeslice", None, True),
        ("nvidia-dra", "mps", "True", False),
        ("nvidia-dra", "exclusive", None, False),  # a whole card is what it asks for
        ("hami-dra", "vgpu", None, False),  # HAMi-DRA's GPUs take several claims
    ],
)
def test_render_pod_says_when_a_dra_claim_takes_a_whole_card(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    preset: str,
    mode: str,
    consumable: str | None,
    warned: bool,
) -> None:
    if consumable is not None:
        monkeypatch.setenv("JUPYTER_GPUSHARE_DRA_CONSUMABLE_CAPACITY", consumable)
    assert main(["render-pod", "--preset", preset, "--mode", mode, "--memory", "6G"]) == 0
    captured = capsys.readouterr()
    documents = list(yaml.safe_load_all(captured.out))
    assert [document["kind"] for document in documents] == ["Pod", "ResourceClaim"]
    said = f"this claim's {mode} request asks for a whole"
    assert (said in captured.err) is warned and (f"# Warning: {said}" in captured.out) is warned
    if warned:
        assert "c.GPUShare.dra_consumable_capacity = True" in captured.err
    if warned and mode == "mps":  # the warning docs/dra.md shows is this one
        page = (Path(__file__).parents[2] / "docs" / "dra.md").read_text()
        assert captured.err.strip() in page
        assert "capacity" not in documents[1]["spec"]["devices"]["requests"][0]["exactly"]
    assert pod_fs_group(documents[0]) == 100  # every kernel pod reads its Secret as the image's group


def pod_fs_group(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["securityContext"]["fsGroup"])


def test_every_rendered_kernel_pod_lets_the_images_group_read_its_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 25: under DRA presets the pod had no fsGroup, its 0400 Secret unreadable by the
    image's user (1000:100); a pod_template's securityContext still wins."""
    for preset in ("nvidia", "hami", "volcano", "kai", "aliyun", "nvidia-dra", "hami-dra"):
        mode = "vgpu" if preset in ("hami", "hami-dra") else "exclusive"
        assert main(["render-pod", "--preset", preset, "--mode", mode, "--memory", "6G"]) == 0
        pod = next(yaml.safe_load_all(capsys.readouterr().out))
        assert pod_fs_group(pod) == 100, preset
        assert pod["spec"]["volumes"][0]["secret"]["defaultMode"] == 0o400


def test_a_pod_template_sets_another_fs_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "JUPYTER_GPUSHARE_POD_TEMPLATE", json.dumps({"spec": {"securityContext": {"fsGroup": 2000}}})
    )
    assert pod_fs_group(rendered(capsys, "--preset", "hami", "--mode", "vgpu", "--memory", "6G")) == 2000
