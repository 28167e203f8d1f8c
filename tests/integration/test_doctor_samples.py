"""The doctor's sample output in docs/troubleshooting/index.md is what it prints (issue 25).

Each sample is the doctor's report in the situation its page describes, run here: NVML (the
edge we do not own) answers as on a machine without an NVIDIA driver; the ledger and the
kernelspecs are real, and so is the test kernel. Paths that differ from machine to machine are
written as a home directory's. A page whose sample drifts fails with the report to paste.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.local.inventory import nvml
from jupyter_gpushare.config import GPUShare, load_settings
from jupyter_gpushare.config.kernelspecs import install_kernelspecs
from jupyter_gpushare.doctor import report, run_checks

from ..support.nvml_fake import make_fake_pynvml

pytestmark = pytest.mark.integration

PAGE = Path(__file__).parents[2] / "docs" / "troubleshooting" / "index.md"
HOME_LEDGER = "~/.local/share/jupyter/runtime/gpushare-ledger.sqlite"
DEMO_POOL = "2xA100-80GB,1xT4-16GB"  # what make demo simulates without a GPU


def page_samples() -> list[str]:
    """The page's ``text`` blocks: the doctor's reports it shows, in order."""
    tokens = MarkdownIt("commonmark").parse(PAGE.read_text(encoding="utf-8"))
    return [token.content for token in tokens if token.type == "fence" and token.info.strip() == "text"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's Jupyter directories with the kernelspec getting-started installs, and NVML
    answering as on a machine without an NVIDIA driver; the runtime directory (the ledger's)."""
    for name in ("CONFIG", "DATA", "RUNTIME"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(f"JUPYTER_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    for variable in ("JUPYTER_GPUSHARE_SIMULATE", "JUPYTER_GPUSHARE_LEDGER_PATH", "KUBECONFIG"):
        monkeypatch.delenv(variable, raising=False)
    install_kernelspecs([], prefix=str(tmp_path / "prefix"), asking=True)
    fake, _ = make_fake_pynvml([], init_error="NVML Shared Library Not Found")
    monkeypatch.setattr(nvml, "_nvml", lambda: fake)
    return tmp_path / "runtime"


def as_on_a_home_machine(text: str, runtime: Path) -> str:
    return text.replace(str(runtime / "gpushare-ledger.sqlite"), HOME_LEDGER)


def assert_shown(index: int, generated: str) -> None:
    samples = page_samples()
    shown = samples[index] if len(samples) > index else ""
    assert shown.strip() == generated.strip(), (
        f"sample {index} of {PAGE.name} is not what the doctor prints; it prints:\n{generated}"
    )


def test_the_sample_of_a_machine_without_a_gpu(home: Path) -> None:
    generated = report(run_checks(load_settings(), kernel=True), as_json=False)
    assert_shown(0, as_on_a_home_machine(generated, home))


def test_the_sample_after_make_demo(home: Path) -> None:
    """The demo's JupyterLab had the simulated pool; the terminal the doctor runs in has not:
    the pool is the one the ledger remembers, and a kernel starts on it."""
    LocalBackend(GPUShare(simulate=DEMO_POOL)).ledger.close()
    generated = report(run_checks(load_settings(), kernel=True), as_json=False)
    assert_shown(1, as_on_a_home_machine(generated, home))
