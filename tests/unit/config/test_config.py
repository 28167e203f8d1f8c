"""``c.GPUShare`` (docs/reference/configuration.md): validation, config files on the Jupyter path,
environment variables."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from jupyter_core.paths import jupyter_config_path, jupyter_runtime_dir
from traitlets.config import Config

from jupyter_gpushare.config import GPUShare, load_settings, settings_env
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS


def write_json_config(directory: Path, section: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "jupyter_server_config.json").write_text(json.dumps({"GPUShare": section}))


def write_py_config(directory: Path, lines: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "jupyter_server_config.py").write_text(lines)


def config_dir() -> Path:
    return Path(os.environ["JUPYTER_CONFIG_DIR"])


@pytest.mark.parametrize(
    ("trait", "value"),
    [
        ("overcommit", 0.5),
        ("overcommit", 0.0),
        ("overcommit", -1.0),
        ("overcommit", math.nan),
        ("default_memory", "abc"),
        ("default_memory", "0G"),
        ("max_memory_per_kernel", "-4G"),
        ("max_memory_per_user", "lots"),
        ("max_memory_per_kernel", "25%"),  # a quota is an amount, not a share of some device
        ("max_memory_per_user", "whole"),
        ("min_memory", "10%"),  # the smallest slice is an amount
        ("min_memory", "lots"),
        ("ledger_lock_timeout", -1.0),
        ("sizes", ["2G", "abc"]),
        ("sizes", ["2G", "0"]),
        ("queue_timeout", -1.0),
        ("sample_interval", -0.5),
        ("server_url", "jupyter-alice:8888"),  # no scheme
        ("server_url", "ftp://jupyter-alice/"),
        ("usage_metrics_url", "http://"),  # no host
        ("usage_metrics_url", "hami-monitor/metrics"),
        ("broker_url", "unix:run/broker.sock"),  # a relative socket path
        ("broker_url", "gpushare-broker:8765"),
        ("broker_url", "tcp://gpushare-broker:8765"),
    ],
)
def test_invalid_values_are_refused_naming_the_trait(trait: str, value: object) -> None:
    with pytest.raises(ValueError) as caught:
        GPUShare(**{trait: value})
    assert trait in str(caught.value)


def test_urls_are_accepted_as_given_or_empty() -> None:
    settings = GPUShare(server_url="https://hub.example.com/user/a/", usage_metrics_url="")
    assert (settings.server_url, settings.usage_metrics_url) == ("https://hub.example.com/user/a/", "")
    for broker in ("unix:/run/jupyter-gpushare/broker.sock", "http://gpushare-broker:8765/", ""):
        assert GPUShare(broker_url=broker).effective_broker_url() == broker


def test_every_trait_says_what_it_is_for() -> None:
    from jupyter_gpushare.broker.settings import GPUShareBroker

    for cls in (GPUShare, GPUShareBroker):
        for name, trait in cls.class_traits(config=True).items():
            assert len(trait.help or "") > 20, f"{cls.__name__}.{name} has no help"


@pytest.mark.parametrize("trait", ["default_memory", "max_memory_per_kernel", "sizes"])
def test_invalid_sizes_list_the_accepted_forms(trait: str) -> None:
    value = ["abc"] if trait == "sizes" else "abc"
    with pytest.raises(ValueError) as caught:
        GPUShare(**{trait: value})
    assert ACCEPTED_FORMS in str(caught.value)


@pytest.mark.parametrize(
    ("trait", "value"),
    [
        ("backend", "cloud"),
        ("default_mode", "bogus"),
        ("when_full", "wait"),
        ("over_limit_action", "explode"),
    ],
)
def test_choices_are_enforced(trait: str, value: str) -> None:
    with pytest.raises(Exception, match=value):
        GPUShare(**{trait: value})


@pytest.mark.parametrize(
    ("trait", "value"),
    [
        ("overcommit", 1.0),
        ("overcommit", 1.75),
        ("default_memory", "25%"),
        ("default_memory", "whole"),
        ("max_memory_per_kernel", "16G"),
        ("max_memory_per_user", None),
        ("sizes", ["1G", "512M", "50%", "whole"]),
        ("min_memory", "1G"),
        ("ledger_lock_timeout", 2.5),
    ],
)
def test_valid_values_are_kept(trait: str, value: object) -> None:
    assert getattr(GPUShare(**{trait: value}), trait) == value


def test_json_config_file_on_the_jupyter_path_is_read() -> None:
    assert str(config_dir()) in jupyter_config_path()
    write_json_config(
        config_dir(),
        {"simulate": "1xT4-16GB", "overcommit": 1.5, "sizes": ["1G", "3G"], "when_full": "fail"},
    )
    settings = load_settings()
    assert settings.simulate == "1xT4-16GB"
    assert settings.overcommit == 1.5
    assert settings.sizes == ["1G", "3G"]
    assert settings.when_full == "fail"


def test_in_one_directory_json_wins_over_python_and_the_servers_file_over_the_common_one_as_in_a_server() -> (
    None
):
    from jupyter_server.serverapp import ServerApp

    write_json_config(config_dir(), {"overcommit": 1.5, "default_memory": "2G"})
    write_py_config(config_dir(), "c.GPUShare.overcommit = 1.25\nc.GPUShare.max_memory_per_user = '24G'\n")
    (config_dir() / "jupyter_config.py").write_text(
        "c.GPUShare.max_memory_per_user = '8G'\nc.GPUShare.sample_interval = 2.0\n"
    )
    settings = load_settings()
    assert settings.overcommit == 1.5
    assert settings.default_memory == "2G"
    assert settings.max_memory_per_user == "24G"
    assert settings.sample_interval == 2.0
    # What a real server makes of the same files (traitlets' own order).
    server = ServerApp()
    assert server.config_file_paths[0] == str(config_dir())
    server.load_config_file()
    for trait in ("overcommit", "default_memory", "max_memory_per_user", "sample_interval"):
        assert getattr(settings, trait) == server.config.GPUShare[trait], trait


def test_the_most_specific_config_directory_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "extra"
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(extra))
    path = jupyter_config_path()
    most_specific = Path(path[0])
    least_specific = Path(
        next(p for p in path if Path(p) in (extra, config_dir()) and Path(p) != most_specific)
    )
    write_json_config(most_specific, {"default_memory": "8G"})
    write_json_config(least_specific, {"default_memory": "2G", "default_mode": "mps"})
    settings = load_settings()
    assert settings.default_memory == "8G"
    assert settings.default_mode == "mps"  # merged from the other file


def test_other_sections_of_the_server_config_are_ignored() -> None:
    (config_dir()).mkdir(parents=True, exist_ok=True)
    (config_dir() / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {"port": 9999}}))
    settings = load_settings()
    assert settings.overcommit == GPUShare().overcommit


def test_an_invalid_config_file_value_is_reported() -> None:
    write_json_config(config_dir(), {"overcommit": 0.5})
    with pytest.raises(Exception, match="overcommit") as caught:
        load_settings()
    assert "1.0" in str(caught.value)  # the limit it must respect


def test_a_callers_config_wins_per_trait_and_the_files_still_count() -> None:
    write_json_config(config_dir(), {"overcommit": 1.5, "default_memory": "2G"})
    config = Config()
    config.GPUShare.default_memory = "6G"
    settings = load_settings(config)
    assert settings.default_memory == "6G"
    assert settings.overcommit == 1.5  # merged per trait: one section never replaces the other
    assert settings.settled is not None
    assert settings.settled.origin("default_memory") == "the application's own configuration"
    assert settings.settled.origin("overcommit") == str(config_dir() / "jupyter_server_config.json")


def test_a_callers_config_without_a_section_falls_back_to_the_files() -> None:
    write_json_config(config_dir(), {"overcommit": 1.5})
    config = Config()
    config.ServerApp.port = 1234
    assert load_settings(config).overcommit == 1.5


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = GPUShare()
    assert settings.effective_simulate() == ""
    assert settings.effective_ledger_path().parent == Path(jupyter_runtime_dir())
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "2xA100-80GB")
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "shared.sqlite"))
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "carol")
    monkeypatch.setenv("JUPYTERHUB_USER", "dave")
    assert settings.effective_simulate() == "2xA100-80GB"
    assert settings.effective_ledger_path() == tmp_path / "shared.sqlite"
    assert settings.effective_owner() == "carol"


def test_traits_win_over_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "2xA100-80GB")
    monkeypatch.setenv("JUPYTER_GPUSHARE_LEDGER_PATH", str(tmp_path / "env.sqlite"))
    monkeypatch.setenv("JUPYTER_GPUSHARE_OWNER", "carol")
    settings = GPUShare(simulate="1xT4-16GB", ledger_path=str(tmp_path / "trait.sqlite"), owner="erin")
    assert settings.effective_simulate() == "1xT4-16GB"
    assert settings.effective_ledger_path() == tmp_path / "trait.sqlite"
    assert settings.effective_owner() == "erin"


def test_owner_falls_back_to_the_hub_user_then_the_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_USER", "dave")
    assert GPUShare().effective_owner() == "dave"
    monkeypatch.delenv("JUPYTERHUB_USER")
    assert GPUShare().effective_owner()  # the login name, whatever it is here


def test_ledger_path_expands_the_home_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert GPUShare(ledger_path="~/ledger.sqlite").effective_ledger_path() == tmp_path / "ledger.sqlite"


# ---- any trait from JUPYTER_GPUSHARE_<TRAIT> ------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "text", "trait", "value"),
    [
        ("JUPYTER_GPUSHARE_OVERCOMMIT", "1.5", "overcommit", 1.5),
        ("JUPYTER_GPUSHARE_SIZES", "2G,4G,whole", "sizes", ["2G", "4G", "whole"]),
        ("JUPYTER_GPUSHARE_SIZES", '["1G", "25%"]', "sizes", ["1G", "25%"]),
        ("JUPYTER_GPUSHARE_WHEN_FULL", "fail", "when_full", "fail"),
        ("JUPYTER_GPUSHARE_MAX_MEMORY_PER_KERNEL", "16G", "max_memory_per_kernel", "16G"),
        ("JUPYTER_GPUSHARE_QUEUE_TIMEOUT", "12", "queue_timeout", 12.0),
        ("JUPYTER_GPUSHARE_SIMULATE", "1xT4-16GB", "simulate", "1xT4-16GB"),
    ],
)
def test_any_trait_can_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, trait: str, value: object
) -> None:
    monkeypatch.setenv(variable, text)
    assert getattr(load_settings(), trait) == value


def test_the_environment_wins_over_the_config_files_and_the_command_line_over_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_json_config(config_dir(), {"overcommit": 1.25, "sample_interval": 3.0, "queue_timeout": 30.0})
    monkeypatch.setenv("JUPYTER_GPUSHARE_OVERCOMMIT", "1.5")
    monkeypatch.setenv("JUPYTER_GPUSHARE_WHEN_FULL", "fail")
    monkeypatch.setenv("JUPYTER_GPUSHARE_SAMPLE_INTERVAL", "2")
    # What an application's own config holds that no file on the path explains (its --config
    # file, jupyter_console_config.py) is under the environment, its command line over it.
    app = Config()
    app.GPUShare.sample_interval = 5.0
    app.GPUShare.queue_timeout = 60.0
    settings = load_settings(app)
    assert settings.overcommit == 1.5
    assert settings.when_full == "fail"
    assert settings.sample_interval == 2.0
    assert settings.queue_timeout == 60.0
    assert settings.settled is not None
    assert settings.settled.origin("sample_interval") == "$JUPYTER_GPUSHARE_SAMPLE_INTERVAL"
    assert settings.settled.origin("queue_timeout") == "the application's own configuration"


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("JUPYTER_GPUSHARE_OVERCOMMIT", "lots"),
        ("JUPYTER_GPUSHARE_OVERCOMMIT", "0.5"),
        ("JUPYTER_GPUSHARE_DEFAULT_MEMORY", "abc"),
        ("JUPYTER_GPUSHARE_SIZES", "2G,abc"),
        ("JUPYTER_GPUSHARE_WHEN_FULL", "sometimes"),
    ],
)
def test_an_invalid_environment_variable_is_reported(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str
) -> None:
    monkeypatch.setenv(variable, text)
    with pytest.raises(Exception) as caught:  # the message is what matters
        load_settings()
    message = str(caught.value)
    assert variable.removeprefix("JUPYTER_GPUSHARE_").lower() in message.lower()


@pytest.mark.parametrize(
    "traits",
    [
        {},
        {"overcommit": 1.5, "sizes": ["1G", "whole"], "when_full": "fail", "default_memory": "25%"},
        {"simulate": "1xT4-16GB", "max_memory_per_user": "24G", "reconcile_on_start": False, "owner": "zed"},
        {"default_mode": "vgpu", "queue_timeout": 0.5, "libvgpu_path": "/opt/libvgpu.so"},
    ],
)
def test_settings_pass_to_a_kernel_through_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, traits: dict
) -> None:
    original = GPUShare(ledger_path=str(tmp_path / "ledger.sqlite"), **traits)
    env = settings_env(original)
    assert all(isinstance(value, str) for value in env.values())
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    copy = load_settings()
    resolved = {"owner", "ledger_path", "simulate"}  # passed on as their effective values
    for name in set(original.trait_names(config=True)) - resolved:
        assert getattr(copy, name) == getattr(original, name), name
    assert copy.effective_simulate() == original.effective_simulate()
    assert copy.effective_ledger_path() == original.effective_ledger_path()
    assert copy.effective_owner() == original.effective_owner()


def test_the_smallest_slice_defaults_to_256m() -> None:
    settings = GPUShare()
    assert (settings.min_memory, settings.min_memory_bytes()) == ("256M", 256 * 2**20)
    assert "CUDA context" in GPUShare.class_traits()["min_memory"].help
