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


def test_the_broker_examples_hold_together() -> None:
    """Z2JH values run the broker as a hub service and give single-user servers its URL and no
    token; the broker's Role is bound to the hub only; the systemd unit serves the socket the
    documented broker_url names."""
    values = yaml.safe_load((EXAMPLES / "jupyterhub" / "z2jh-broker-values.yaml").read_text())
    config = Config()
    config.JupyterHub.services = []
    namespace: dict[str, Any] = {"c": config}
    exec(values["hub"]["extraConfig"]["gpushare-broker"], namespace)
    [service] = config.JupyterHub.services
    assert service["command"][:2] == ["jupyter-gpushare", "broker"] and "kubernetes" in service["command"]
    traits = GPUShare.class_traits(config=True)
    for name in service["environment"]:
        assert name.removeprefix("JUPYTER_GPUSHARE_").lower() in traits, name
    GPUShare(**{k.removeprefix("JUPYTER_GPUSHARE_").lower(): v for k, v in service["environment"].items()})
    singleuser = values["singleuser"]
    assert singleuser["extraPodConfig"]["automountServiceAccountToken"] is False
    assert singleuser["extraEnv"]["JUPYTER_GPUSHARE_BROKER_URL"].rstrip("/") == service["url"]
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes" / "broker-rbac.yaml").read_text()))
    bindings = [doc for doc in documents if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {(s["name"], s["namespace"]) for b in bindings for s in b["subjects"]} == {("hub", "jupyter")}
    unit = (EXAMPLES / "systemd" / "jupyter-gpushare-broker.service").read_text()
    assert "broker --socket /run/jupyter-gpushare/broker.sock" in unit
    assert 'broker_url = "unix:/run/jupyter-gpushare/broker.sock"' in unit
