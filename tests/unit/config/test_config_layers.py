"""Where each setting comes from (config/layers.py, config/loading.py): layers merged per trait,
the administrator's settings a user's own file cannot override, and what a process says of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from traitlets.config import Config

from jupyter_gpushare.config import GPUShare, Layer, load_settings, unreported_warnings
from jupyter_gpushare.config.layers import SOURCES, settle
from jupyter_gpushare.config.loading import (
    APPLICATION,
    administered_traits,
    config_directories,
    environment_layers,
)

ADMINISTERED = frozenset({"broker_url", "max_memory_per_user"})


def admin(values: dict[str, object], name: str = "/etc/jupyter/jupyter_server_config.py") -> Layer:
    return Layer(name, "system file", values, administrator=True)


def user(values: dict[str, object], name: str = "/home/alice/.jupyter/jupyter_config.py") -> Layer:
    return Layer(name, "user file", values)


def test_layers_merge_per_trait_the_highest_winning() -> None:
    settled = settle(
        [
            Layer("$JUPYTER_GPUSHARE_SAMPLE_INTERVAL", "environment variable", {"sample_interval": 0.5}),
            Layer(
                "/etc/jupyter/jupyter_server_config.py",
                "system file",
                {"sample_interval": 3.0, "overcommit": 1.5},
            ),
            user({"sample_interval": 2.0}),
        ],
        ADMINISTERED,
    )
    assert settled.values == {"sample_interval": 2.0, "overcommit": 1.5}
    assert settled.origin("sample_interval") == "/home/alice/.jupyter/jupyter_config.py"
    assert settled.origin("overcommit") == "/etc/jupyter/jupyter_server_config.py"
    assert settled.origin("default_memory") == "default"
    assert settled.ignored == ()


def test_a_users_layer_cannot_change_what_an_administrators_file_sets_and_says_so() -> None:
    settled = settle(
        [
            admin({"broker_url": "unix:/run/b.sock", "sample_interval": 3.0}),
            user({"broker_url": "", "sample_interval": 2.0}),
            Layer(APPLICATION, "application", {"max_memory_per_user": "80G"}),
        ],
        ADMINISTERED,
    )
    assert settled.values["broker_url"] == "unix:/run/b.sock"
    assert settled.values["sample_interval"] == 2.0  # not administered: the user's own
    assert settled.values["max_memory_per_user"] == "80G"  # the administrator did not set it
    [ignored] = settled.ignored
    assert ignored.trait == "broker_url" and ignored.layer == "/home/alice/.jupyter/jupyter_config.py"
    assert ignored.sentence() == (
        "GPUShare.broker_url = '' in /home/alice/.jupyter/jupyter_config.py is ignored: the "
        "administrator sets it to 'unix:/run/b.sock' in /etc/jupyter/jupyter_server_config.py, "
        "which a user's settings cannot override"
    )


def test_the_same_value_again_is_no_conflict_and_an_administrator_may_override_an_administrator() -> None:
    settled = settle(
        [
            admin({"broker_url": "unix:/a.sock", "max_memory_per_user": "8G"}),
            admin({"broker_url": "unix:/b.sock"}, "/opt/jupyter/etc/jupyter/jupyter_server_config.py"),
            user({"max_memory_per_user": "8G"}),
        ],
        ADMINISTERED,
    )
    assert settled.values == {"broker_url": "unix:/b.sock", "max_memory_per_user": "8G"}
    assert settled.origin("broker_url") == "/opt/jupyter/etc/jupyter/jupyter_server_config.py"
    assert settled.ignored == ()


def test_the_environment_cannot_override_an_administrators_file_either() -> None:
    settled = settle(
        [
            admin({"broker_url": "unix:/b"}),
            Layer("$JUPYTER_GPUSHARE_BROKER_URL", "environment variable", {"broker_url": ""}),
        ],
        ADMINISTERED,
    )
    assert settled.values["broker_url"] == "unix:/b"
    assert [ignored.layer for ignored in settled.ignored] == ["$JUPYTER_GPUSHARE_BROKER_URL"]
    assert settled.broker_bypassed() is None


def test_a_broker_named_in_a_file_and_emptied_later_is_a_process_that_starts_no_kernel() -> None:
    """Where no administrator's file holds the broker (root's own files, a file the user may
    write): one sentence naming the file and what emptied it."""
    settled = settle(
        [
            Layer("/etc/jupyter/jupyter_server_config.py", "system file", {"broker_url": "unix:/b.sock"}),
            Layer("$JUPYTER_GPUSHARE_BROKER_URL", "environment variable", {"broker_url": ""}),
        ],
        ADMINISTERED,
    )
    assert settled.broker_bypassed() == (
        "GPUShare.broker_url = 'unix:/b.sock' in /etc/jupyter/jupyter_server_config.py names the GPU "
        "broker, but $JUPYTER_GPUSHARE_BROKER_URL sets it to '': this process would place kernels "
        "outside the broker, beside everyone else's, so it starts none (remove one of the two settings)"
    )
    # The broker named and used, or named nowhere: nothing to refuse.
    used = settle([Layer("/etc/j.py", "system file", {"broker_url": "unix:/b"})], ADMINISTERED)
    nowhere = settle([Layer("$X", "environment variable", {"broker_url": ""})], ADMINISTERED)
    assert used.broker_bypassed() is None and nowhere.broker_bypassed() is None


def test_the_administered_settings_are_where_the_pool_is_its_limits_and_its_queues_order() -> None:
    assert administered_traits() == {
        "backend",
        "broker_url",
        "ledger_path",
        "simulate",
        "overcommit",
        "max_memory_per_kernel",
        "max_memory_per_user",
        "min_memory",
        "queue_policy",
    }


def test_the_summary_names_the_files_and_where_each_setting_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config_dir = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_config.py").write_text("c.GPUShare.sample_interval = 2\n")
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIMULATE", "1xT4-16GB")
    settings = load_settings()
    assert settings.settled is not None
    assert settings.settled.summary() == (
        f"config files: {config_dir / 'jupyter_config.py'}; "
        f"sample_interval from {config_dir / 'jupyter_config.py'}; "
        "simulate from $JUPYTER_GPUSHARE_SIMULATE"
    )


def test_a_user_file_that_sets_one_trait_leaves_the_servers_files_in_force() -> None:
    """The issue-37 bug: any GPUShare line in ~/.jupyter/jupyter_config.py made a console's
    kernel ignore the broker of the server config files."""
    config_dir = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(
        '{"GPUShare": {"broker_url": "unix:/run/jupyter-gpushare/broker.sock"}}'
    )
    # What jupyter console's kernel manager has: its app read jupyter_config.py only.
    console = Config()
    console.GPUShare.sample_interval = 2.0
    settings = load_settings(console)
    assert settings.broker_url == "unix:/run/jupyter-gpushare/broker.sock"
    assert settings.sample_interval == 2.0


def test_a_config_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    config_dir = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_config.py").write_text("c.GPUShare.sample_interval = = 2\n")
    with pytest.raises(Exception, match=r"cannot read the config file .*jupyter_config\.py"):
        load_settings()


def test_the_directories_are_the_jupyter_config_path_least_specific_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "extra"))
    directories = config_directories([(str(tmp_path / "own"), "system file")])
    assert directories[-1] == (str(tmp_path / "own"), "system file")
    assert directories[-2] == (str(tmp_path / "extra"), "user file")
    assert (os.environ["JUPYTER_CONFIG_DIR"], "user file") in directories
    assert directories[0][1] == "system file"
    assert {source for _, source in directories} <= set(SOURCES)


def test_environment_variables_are_one_layer_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPUSHARE_SIZES", "2G,4G")
    monkeypatch.setenv("JUPYTER_GPUSHARE_OVERCOMMIT", "1.5")
    layers = {layer.name: dict(layer.values) for layer in environment_layers()}
    assert layers == {
        "$JUPYTER_GPUSHARE_SIZES": {"sizes": ["2G", "4G"]},
        "$JUPYTER_GPUSHARE_OVERCOMMIT": {"overcommit": 1.5},
    }


def test_each_warning_is_told_once_per_process() -> None:
    settings = GPUShare()
    settings.settled = settle(
        [admin({"broker_url": "unix:/once.sock"}), user({"broker_url": "unix:/mine.sock"})], ADMINISTERED
    )
    [sentence] = unreported_warnings(settings)
    assert "unix:/mine.sock" in sentence
    assert unreported_warnings(settings) == []
