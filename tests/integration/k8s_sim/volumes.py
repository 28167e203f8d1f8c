"""A pod's volumes on disk, laid out as kubelet lays them out, and the check that nothing wrote
into a Secret volume (read-only in a real cluster).

The kubelet (kubelet.py) materialises a pod's volumes before its containers start, and checks
the Secret volumes when the containers end; each write found is a violation the test sees.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from .api import ApiServer
from .events import post_event
from .resources import SECRETS

# The timestamped directory kubelet writes a Secret's files into; ``..data`` links to it.
SECRET_DATA_DIRECTORY = "..2025_01_01_00_00_00.000000000"


async def materialise(
    api: ApiServer, pod: dict[str, Any], directory: Path, pod_ip: str, digests: dict[Path, str]
) -> dict[str, Path] | None:
    """The pod's volumes under ``directory`` by volume name; None while a Secret is missing
    (after a ``FailedMount`` event, as kubelet retries the mount). The digest of every Secret
    file goes into ``digests`` for :func:`secret_writes`."""
    (directory / "home").mkdir(parents=True, exist_ok=True)
    namespace = pod["metadata"]["namespace"]
    volumes: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        target = directory / "volumes" / volume["name"]
        if "secret" in volume:
            async with api._lock:
                secret = api.get(SECRETS, namespace, volume["secret"]["secretName"])
            if secret is None:
                await post_event(
                    api,
                    pod,
                    "FailedMount",
                    f'MountVolume.SetUp failed for volume "{volume["name"]}" : secret '
                    f'"{volume["secret"]["secretName"]}" not found',
                    "Warning",
                    "kubelet",
                )
                shutil.rmtree(directory, ignore_errors=True)
                return None
            files = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
            if "connection.json" in files:
                info = json.loads(files["connection.json"])
                if info.get("ip") == "0.0.0.0":  # the pod's own address on this shared host
                    info["ip"] = pod_ip
                    files["connection.json"] = json.dumps(info).encode()
            digests.update(
                write_secret_volume(target, files, int(volume["secret"].get("defaultMode", 0o644)))
            )
        else:  # emptyDir (and anything else: an empty directory)
            target.mkdir(parents=True)
        volumes[volume["name"]] = target
    return volumes


def write_secret_volume(target: Path, files: dict[str, bytes], mode: int) -> dict[Path, str]:
    """A Secret's files in ``target`` as kubelet writes them: the data in a timestamped
    directory, ``..data`` linking to it, and each key a link through ``..data``. Returns each
    visible file's SHA-256."""
    data = target / SECRET_DATA_DIRECTORY
    data.mkdir(parents=True)
    digests: dict[Path, str] = {}
    for key, content in files.items():
        (data / key).write_bytes(content)
        (data / key).chmod(mode)
        digests[target / key] = hashlib.sha256(content).hexdigest()
    (target / "..data").symlink_to(data.name)
    for key in files:
        (target / key).symlink_to(f"..data/{key}")
    return digests


def secret_writes(digests: dict[Path, str]) -> list[str]:
    """The Secret files (by name) that are no longer the kubelet's link or no longer hold what
    was written."""
    return [
        path.name
        for path, digest in digests.items()
        if not path.is_symlink() or hashlib.sha256(path.read_bytes()).hexdigest() != digest
    ]
