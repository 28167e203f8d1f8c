"""How any process finds its ``GPUShare`` settings.

A server reads them from its own config. A kernel provisioner started by ``jupyter console``,
nbclient or papermill has no server config, so :func:`load_settings` also reads the
``GPUShare`` section of the ``jupyter_server_config`` files on the Jupyter config path. Any
trait the config leaves unset can come from ``JUPYTER_GPUSHARE_<TRAIT>`` in the environment
(``JUPYTER_GPUSHARE_SIMULATE``, ``JUPYTER_GPUSHARE_LEDGER_PATH``…), which is how a JupyterHub
spawner, a test or a CI job points every process at one pool, and how a kernel learns the
settings of the process that started it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jupyter_core.paths import jupyter_config_path
from traitlets import Dict, List, TraitError
from traitlets.config import Config
from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

from .. import env_names
from ..errors import ConfigurationError
from .traits import GPUShare

CONFIG_FILES = ("jupyter_server_config.json", "jupyter_server_config.py")


def load_settings(
    config: Config | None = None, *, from_files: bool = True, reconcile: bool = True
) -> GPUShare:
    """The ``GPUShare`` settings for this process.

    ``config`` is the caller's traitlets config (a server passes its own). When it has no
    ``GPUShare`` section, the ``jupyter_server_config.{json,py}`` files on the Jupyter config
    path are read for one, so a kernel started outside a server follows the same settings.
    """
    if config is None or "GPUShare" not in config:
        config = config_from_files() if from_files else Config()
    if not reconcile:
        config = Config(config)
        config.GPUShare.reconcile_on_start = False
    try:
        return GPUShare(config=_with_environment(config))
    except (TraitError, ValueError) as error:
        raise ConfigurationError(f"invalid GPUShare configuration: {error}") from None


def settings_env(settings: GPUShare) -> dict[str, str]:
    """Every configurable setting as ``JUPYTER_GPUSHARE_<TRAIT>`` variables.

    A kernel gets these so that the code acting on its own slice inside it follows exactly the
    settings of the process that started it, whatever config files the kernel can or cannot read.
    """
    env: dict[str, str] = {}
    for name in settings.trait_names(config=True):
        value = getattr(settings, name)
        if value is None or value == "":
            continue
        if isinstance(value, (list, dict)) and not value:
            continue
        env[env_names.trait_variable(name)] = (
            json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        )
    env[env_names.LEDGER_PATH] = str(settings.effective_ledger_path())
    env[env_names.OWNER] = settings.effective_owner()
    if settings.effective_simulate():
        env[env_names.SIMULATE] = settings.effective_simulate()
    return env


def _with_environment(config: Config) -> Config:
    """Fill settings the config leaves unset from ``JUPYTER_GPUSHARE_<TRAIT>`` variables."""
    section = config.get("GPUShare", {})
    from_env = Config()
    for name, trait in GPUShare.class_traits(config=True).items():
        variable = env_names.trait_variable(name)
        if name in section or variable not in os.environ:
            continue
        text = os.environ[variable]
        try:
            if isinstance(trait, Dict):
                value = json.loads(text)
            elif isinstance(trait, List):
                # A JSON list, or the friendlier "2G,4G,whole".
                value = json.loads(text) if text.lstrip().startswith("[") else text.split(",")
            else:
                value = trait.from_string(text)
            from_env.GPUShare[name] = value
        except (TraitError, ValueError) as error:
            raise ConfigurationError(f"invalid ${variable}: {error}") from None
    merged = Config()
    merged.merge(config)
    merged.merge(from_env)
    return merged


def read_config_files(
    sections: tuple[str, ...] = ("GPUShare",), directories: list[str] | None = None
) -> tuple[Config, list[Path]]:
    """The ``sections`` of the ``jupyter_server_config`` files in ``directories`` (by default
    the Jupyter config path, most specific first: it wins), and the files that had any of them
    (the winning first)."""
    merged = Config()
    read: list[Path] = []
    for directory in reversed(jupyter_config_path() if directories is None else directories):
        for filename in CONFIG_FILES:
            if not os.path.isfile(os.path.join(directory, filename)):
                continue
            loader_class = JSONFileConfigLoader if filename.endswith(".json") else PyFileConfigLoader
            loaded = loader_class(filename, path=directory).load_config()
            found = [section for section in sections if section in loaded]
            for section in found:
                merged.merge(Config({section: loaded[section]}))
            if found:
                read.insert(0, Path(directory) / filename)
    return merged, read


def config_from_files(sections: tuple[str, ...] = ("GPUShare",)) -> Config:
    """The ``sections`` of the ``jupyter_server_config`` files on the Jupyter config path."""
    return read_config_files(sections)[0]
