"""The example configurations stay valid and in step with the code that generates them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from traitlets.config import Config

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.hub import static_profiles

EXAMPLES = Path(__file__).parents[2] / "examples"


def run_config(path: Path) -> Config:
    config = Config()
    namespace: dict[str, Any] = {"get_config": lambda: config}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return config


def test_the_server_config_example_is_valid() -> None:
    config = run_config(EXAMPLES / "jupyter_server_config.py")
    settings = GPUShare(config=config)  # validation raises on any bad value
    assert settings.overcommit == 1.25 and settings.when_full == "queue"


def test_the_team_hub_config_wires_the_budget_form() -> None:
    config = run_config(EXAMPLES / "jupyterhub" / "jupyterhub_config.py")
    assert 'name="gpu_budget"' in config.Spawner.options_form
    assert config.Spawner.options_from_form({"gpu_budget": ["8G"]}) == {"gpu_budget": "8G"}


def test_the_z2jh_values_are_what_the_cli_generates() -> None:
    for name, mode, preset in (
        ("z2jh-hami-values.yaml", "vgpu", "hami"),
        ("z2jh-timeslice-values.yaml", "timeslice", "nvidia"),
    ):
        values = yaml.safe_load((EXAMPLES / "jupyterhub" / name).read_text())
        assert values["singleuser"]["profileList"] == static_profiles(
            ["4G", "8G", "16G"], mode, preset=preset
        )
