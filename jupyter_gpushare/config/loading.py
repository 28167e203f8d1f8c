"""How any process finds its ``GPUShare`` settings: the layers of :mod:`.layers`, read from disk.

Every process reads the same files, whatever application it is: a server, a kernel provisioner
started by ``jupyter console``, nbconvert or papermill, ``jupyter gpushare status``. Each reads the
``GPUShare`` section of the ``jupyter_config`` and ``jupyter_server_config`` files on the Jupyter
config path, merged per trait under the application's own configuration, the
``JUPYTER_GPUSHARE_<TRAIT>`` variables and the command line (:mod:`.layers`), so that one
``c.GPUShare`` line in a user's own file changes that one setting and nothing else. A kernel gets
its settings from the process that started it (:func:`settings_env`) and reads no file.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jupyter_core import paths as jupyter_paths
from traitlets import Dict, List, TraitError
from traitlets.config import Application, Config
from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

from jupyter_gpushare.config.layers import ADMINISTERED, Layer, Settled, Source, settle
from jupyter_gpushare.config.traits import GPUShare
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import ConfigurationError

# In each directory, the files every Jupyter application reads, then the server's: a server's
# own file wins over the common one, and .json over .py, as traitlets loads them.
CONFIG_FILES = (
    "jupyter_config.py",
    "jupyter_config.json",
    "jupyter_server_config.py",
    "jupyter_server_config.json",
)

COMMAND_LINE = "the command line"
APPLICATION = "the application's own configuration"


def administered_traits() -> frozenset[str]:
    """The traits an administrator's file decides for every user (tagged ``administered``)."""
    return frozenset(GPUShare.class_trait_names(config=True, **{ADMINISTERED: True}))


def load_settings(
    config: Config | None = None,
    *,
    from_files: bool = True,
    reconcile: bool = True,
    directories: Sequence[tuple[str, Source]] = (),
) -> GPUShare:
    """The ``GPUShare`` settings for this process, with where each came from (``settled``).

    ``config`` is the caller's traitlets config (a server's, a kernel manager's): what it sets
    that no config file on the path explains is the application's own (its command line, its own
    config file) and wins over the files. Without ``from_files`` (a kernel) only the environment
    and ``config`` count. ``directories`` are read above the Jupyter config path (the broker's
    own configuration directory).
    """
    files: list[Layer] = []
    if from_files:
        files = [file_layer(path, source, loaded) for path, source, loaded in config_files(directories)]
    own, command_line = application_layers(config, files)
    layers = [*files, own, *environment_layers(), command_line]
    settled = settle(layers, administered_traits())
    section = Config(settled.values)
    if not reconcile:
        section.reconcile_on_start = False
    try:
        settings = GPUShare(config=Config({"GPUShare": section}))
    except (TraitError, ValueError) as error:
        raise ConfigurationError(f"invalid GPUShare configuration: {error}") from None
    settings.settled = settled
    return settings


_reported: set[str] = set()
_reported_lock = threading.Lock()


def unreported_warnings(settings: GPUShare) -> list[str]:
    """The sentences about ``settings`` (a user's value an administrator's file overrules) that
    this process has not told yet: a provisioner loads its settings at every start, and says each
    once."""
    sentences = [ignored.sentence() for ignored in (settings.settled.ignored if settings.settled else ())]
    with _reported_lock:
        new = [sentence for sentence in sentences if sentence not in _reported]
        _reported.update(new)
    return new


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


# ---- the layers --------------------------------------------------------------------------------


def environment_layers() -> list[Layer]:
    """One layer per ``JUPYTER_GPUSHARE_<TRAIT>`` variable that is set."""
    layers = []
    for name, trait in GPUShare.class_traits(config=True).items():
        variable = env_names.trait_variable(name)
        if variable not in os.environ:
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
        except (TraitError, ValueError) as error:
            raise ConfigurationError(f"invalid ${variable}: {error}") from None
        layers.append(Layer(f"${variable}", "environment variable", {name: value}))
    return layers


def file_layer(path: Path, source: Source, loaded: Config) -> Layer:
    return Layer(str(path), source, dict(loaded.get("GPUShare", {})), administrator=administrator_file(path))


def application_layers(config: Config | None, files: Iterable[Layer]) -> tuple[Layer, Layer]:
    """What ``config`` (an application's merged configuration) sets that no config file explains
    (above every file), and what its command line sets (above the environment)."""
    section = dict((config or Config()).get("GPUShare", {}))
    application = Application.instance() if Application.initialized() else None
    command_line = dict(getattr(application, "cli_config", Config()).get("GPUShare", {}))
    from_files: dict[str, list[Any]] = {}
    for layer in files:
        for trait, value in layer.values.items():
            from_files.setdefault(trait, []).append(value)
    own = {
        trait: value
        for trait, value in section.items()
        if trait not in command_line and not _among(value, from_files.get(trait, []))
    }
    given = {trait: value for trait, value in section.items() if trait in command_line}
    return Layer(APPLICATION, "application", own), Layer(COMMAND_LINE, "command line", given)


def _among(value: Any, values: list[Any]) -> bool:
    try:
        return any(value == other for other in values)
    except Exception:  # a lazy value (c.GPUShare.sizes.append(...)) compares with nothing
        return False


def config_directories(extra: Sequence[tuple[str, Source]] = ()) -> list[tuple[str, Source]]:
    """The Jupyter config path, least specific first, each directory with the source it is, and ``extra``
    directories above them all."""
    # Read when asked, not when imported: a test harness may point jupyter_core elsewhere.
    system = {os.path.realpath(directory) for directory in jupyter_paths.SYSTEM_CONFIG_PATH}
    environment = {os.path.realpath(directory) for directory in jupyter_paths.ENV_CONFIG_PATH}
    seen: set[str] = set()
    directories: list[tuple[str, Source]] = []
    # jupyter_config_path() is most specific first; a directory named twice counts where it is
    # most specific.
    for directory in [*(d for d, _ in reversed(extra)), *jupyter_paths.jupyter_config_path()]:
        real = os.path.realpath(directory)
        if real in seen:
            continue
        seen.add(real)
        source: Source = dict(extra).get(directory) or (
            "system file" if real in system else "environment file" if real in environment else "user file"
        )
        directories.insert(0, (directory, source))
    return directories


def config_files(extra: Sequence[tuple[str, Source]] = ()) -> list[tuple[Path, Source, Config]]:
    """Every config file on the path (and in ``extra``), least specific first, as loaded."""
    found = []
    for directory, source in config_directories(extra):
        for filename in CONFIG_FILES:
            path = Path(directory) / filename
            if path.is_file():
                found.append((path, source, load_file(path)))
    return found


_loaded: dict[Path, tuple[tuple[int, int, int], Config]] = {}
_loaded_lock = threading.Lock()


def load_file(path: Path) -> Config:
    """One config file, as traitlets reads it; read again only when it changed (a provisioner
    loads its settings at every kernel start)."""
    try:
        stat = path.stat()
    except OSError as error:
        raise ConfigurationError(f"cannot read the config file {path}: {error.strerror}") from None
    key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    with _loaded_lock:
        cached = _loaded.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    loader_class = JSONFileConfigLoader if path.suffix == ".json" else PyFileConfigLoader
    try:
        loaded = loader_class(path.name, path=str(path.parent)).load_config()
    except Exception as error:  # a config file is code: whatever it raises is its author's fault
        raise ConfigurationError(f"cannot read the config file {path}: {error}") from None
    with _loaded_lock:
        _loaded[path] = (key, loaded)
    return loaded


def administrator_file(path: Path) -> bool:
    """Whether the user running this process can neither write ``path`` nor replace it."""
    return not (os.access(path, os.W_OK) or os.access(path.parent, os.W_OK))


__all__ = [
    "APPLICATION",
    "COMMAND_LINE",
    "CONFIG_FILES",
    "Settled",
    "administered_traits",
    "administrator_file",
    "config_directories",
    "config_files",
    "environment_layers",
    "load_settings",
    "settings_env",
    "unreported_warnings",
]
