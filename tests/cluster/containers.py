"""What a kubelet makes of a pod's spec, as pure functions: a container's command and environment
run as a local process (mount paths pointing at the volumes on disk), the image ID a runtime
reports, and an event about a pod. The node side's kubelet (kubelet.py) runs containers this way.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .nodes import timestamp


def image_id(image: str) -> str:
    """The image's ID as the container runtime reports it once pulled (a digest; made up here)."""
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def container_process(
    container: Mapping[str, Any],
    volumes: Mapping[str, Path],
    home: Path,
    hostname: str,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The container's command and environment as a local process: mount paths rewritten to the
    volumes' directories, a home of its own, this Python first on PATH, ``extra_env`` (what a DRA
    driver adds) under the container's own variables."""
    mounts = sorted(
        ((mount["mountPath"], volumes[mount["name"]]) for mount in container.get("volumeMounts") or []),
        key=lambda pair: -len(pair[0]),
    )

    def local(text: str) -> str:
        for path, directory in mounts:
            text = text.replace(path, str(directory))
        return text

    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
        "XDG_CONFIG_DIRS": str(home / ".system-config"),  # the image's /etc/jupyter: none
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"),
        "IPYTHONDIR": str(home / ".ipython"),
        "HOSTNAME": hostname,
        **(extra_env or {}),
    }
    for item in container.get("env") or []:
        env[item["name"]] = local(str(item.get("value", "")))
    # The image's entrypoint is taken to be empty: command, then args (KubeSpawner sets args).
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return [local(part) for part in argv], env


def pod_event(
    pod: Mapping[str, Any], reason: str, message: str, kind: str, component: str, host: str | None = None
) -> dict[str, Any]:
    """A core ``Event`` about ``pod`` from ``component`` (``kind``: Normal or Warning), as kubelet
    posts them (what ``kubectl describe`` shows)."""
    metadata = pod["metadata"]
    stamp = timestamp()
    name = f"{metadata['name']}.{time.time_ns():x}"  # kubelet's names: listed in the order made
    source = {"component": component, **({"host": host} if host else {})}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": source,
        "reportingComponent": component,
        **({"reportingInstance": host} if host else {}),
    }
