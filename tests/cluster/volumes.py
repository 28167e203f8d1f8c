"""A pod's Secret volumes on disk, laid out as kubelet lays them out, and the check that nothing
wrote into one (read-only in a real cluster). Pure file work: the kubelet (kubelet.py) reads the
Secrets and hands their files here.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The timestamped directory kubelet writes a Secret's files into; ``..data`` links to it.
SECRET_DATA_DIRECTORY = "..2025_01_01_00_00_00.000000000"


def secret_files(secret: Mapping[str, Any], pod_ip: str) -> dict[str, bytes]:
    """A Secret's files; a kernel connection file that listens on every address gets the pod's
    own (pods on one host cannot each own the fixed kernel ports: the one liberty taken)."""
    files = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
    if "connection.json" in files:
        info = json.loads(files["connection.json"])
        if info.get("ip") == "0.0.0.0":
            info["ip"] = pod_ip
            files["connection.json"] = json.dumps(info).encode()
    return files


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
