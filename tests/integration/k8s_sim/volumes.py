"""A pod's volumes on disk, laid out as kubelet lays them out, and the check that nothing wrote
into a Secret volume (read-only in a real cluster). The files' layout is the real cluster's
node side's (tests/cluster/volumes.py).

The kubelet (kubelet.py) materialises a pod's volumes before its containers start, and checks
the Secret volumes when the containers end; each write found is a violation the test sees.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...cluster.volumes import secret_files, secret_writes, write_secret_volume
from .api import ApiServer
from .events import post_event
from .resources import SECRETS


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
            files = secret_files(secret, pod_ip)
            digests.update(
                write_secret_volume(target, files, int(volume["secret"].get("defaultMode", 0o644)))
            )
        else:  # emptyDir (and anything else: an empty directory)
            target.mkdir(parents=True)
        volumes[volume["name"]] = target
    return volumes


__all__ = ["materialise", "secret_writes", "write_secret_volume"]
