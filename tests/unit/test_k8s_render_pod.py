"""``jupyter gpushare render-pod``: prints exactly the pod the backend builds, follows the
server's configuration, a kernelspec and flags, and refuses bad input with the reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from k8s_pods import (
    container,
    env_of,
    validate,
)

from jupyter_gpushare.cli import main
from jupyter_gpushare.config import load_settings
from jupyter_gpushare.k8s.build import DEFAULT_ARGV, cluster_facts, kernel_pod
from jupyter_gpushare.kernelspec import install_kernelspecs
from jupyter_gpushare.sizes import ACCEPTED_FORMS
from jupyter_gpushare.slice_request import make_slice_request


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
    [(name, _)] = install_kernelspecs(["8G"], "mps", user=True)
    pod = rendered(capsys, "--kernelspec", name)
    assert pod == expected_render("8G", "mps")
    assert env_of(pod)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    # Flags win over the kernelspec.
    assert rendered(capsys, "--kernelspec", name, "--memory", "2G") == expected_render("2G", "mps")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "0G"], ACCEPTED_FORMS),
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
