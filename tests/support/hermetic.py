"""What makes a test session hermetic: the Jupyter config directories it reads are its own."""

from __future__ import annotations

import os
import sys

from jupyter_core.paths import SYSTEM_CONFIG_PATH, jupyter_config_path


def foreign_config_directories(home: str) -> list[str]:
    """The directories on the Jupyter config path (system ones included) that are neither under
    ``home`` (the session's own) nor this Python environment's ``etc/jupyter`` (the project's own
    virtual environment, where the server extension is enabled)."""
    own = (os.path.realpath(home) + os.sep, os.path.realpath(os.path.join(sys.prefix, "etc", "jupyter")))
    return [
        directory
        for directory in [*jupyter_config_path(), *SYSTEM_CONFIG_PATH]
        if not (os.path.realpath(directory) + os.sep).startswith(own[0])
        and os.path.realpath(directory) != own[1]
    ]


def isolated_from_the_machine() -> dict[str, str]:
    """What keeps a process from reading the machine's Jupyter config directories: add it to an
    environment made from scratch (a broker's, a spawner's, a pod's). The session's own system
    directory (tests/conftest.py set ``XDG_CONFIG_DIRS``) stands for ``/etc/jupyter``."""
    return {"JUPYTER_PLATFORM_DIRS": "1", "XDG_CONFIG_DIRS": os.environ["XDG_CONFIG_DIRS"]}
