"""The kubelet: runs the pods bound to the simulated nodes as local processes and reports
their status the way kubelet does.

It "pulls" images (unknown ones fail with ``ErrImagePull``, then ``ImagePullBackOff``),
materialises the pod's Secret and emptyDir volumes in a temp dir (volumes.py), runs the init
and main containers' commands with the pod's environment (mount paths rewritten to the temp
dirs), gives every pod its own loopback address (127.X.Y.2, .3, … in a subnet of the cluster's
own) as pod IP — written into the materialised connection file in place of ``0.0.0.0``, the one
liberty taken, since pods on one host cannot each own the fixed kernel ports — and reports
phase, container states and events. Deleting a pod stops its process (within its grace period);
a test can OOM-kill one. Any write into a Secret volume is recorded as a violation.

The node (node.py) calls :meth:`Kubelet.sync` for every pod bound to a node,
:meth:`~Kubelet.terminate` for pods marked for deletion and :meth:`~Kubelet.forget` for pods
the API no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...cluster.containers import container_process, image_id
from .api import ApiServer
from .events import post_event
from .resources import PODS, now
from .volumes import materialise, secret_writes


@dataclass
class Running:
    """A pod the node runs: its process, directories and what its Secret volumes held."""

    uid: str
    namespace: str
    name: str
    ip: str
    directory: Path
    process: asyncio.subprocess.Process | None = None
    secret_digests: dict[Path, str] = field(default_factory=dict)
    ended: bool = False
    stopping: bool = False
    log: Path | None = None


class Kubelet:
    """The pods of all simulated nodes, run in ``workdir``; writes into Secret volumes go to
    ``violations``."""

    def __init__(
        self, api: ApiServer, workdir: Path, violations: list[str], broken_images: Iterable[str] = ()
    ) -> None:
        self.api = api
        self.workdir = workdir
        self.violations = violations
        self.broken_images = set(broken_images)
        self.running: dict[str, Running] = {}  # pod uid -> its process and directories
        self.logs: dict[str, Path] = {}  # pod name -> the kernel's stdout and stderr
        self._addresses = itertools.count(2)
        # A loopback subnet of this cluster's own (127.X.Y.0/24): two test runs on one machine
        # (the fixed kernel ports of pods) cannot collide.
        self._subnet = f"127.{random.randint(1, 254)}.{random.randint(0, 254)}"
        self._pull_failed: dict[str, float] = {}

    async def sync(self, pod: dict[str, Any]) -> None:
        """A pod bound to a node: start it when it is new, notice when its container ended."""
        uid, status = pod["metadata"]["uid"], pod.get("status") or {}
        if uid not in self.running and status.get("phase") == "Pending":
            await self._start(pod)
        elif uid in self.running:
            await self._watch(pod, self.running[uid])

    async def forget(self, present: set[str]) -> None:
        """Kill and forget the pods whose uid the API no longer has (deleted with grace 0)."""
        for uid, running in list(self.running.items()):
            if uid not in present:
                await self._stop(running, grace=0)
                self.running.pop(uid, None)

    async def _start(self, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        images = [c["image"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
        broken = next((image for image in images if image in self.broken_images), None)
        if broken is not None:
            await self._pull_failure(pod, broken)
            return
        running = Running(
            metadata["uid"],
            metadata["namespace"],
            metadata["name"],
            f"{self._subnet}.{next(self._addresses)}",
            self.workdir / f"{metadata['name']}-{metadata['uid'][:8]}",
        )
        mounts_by_volume = await materialise(
            self.api, pod, running.directory, running.ip, running.secret_digests
        )
        if mounts_by_volume is None:
            return  # a Secret is missing: kubelet retries the mount
        self.running[running.uid] = running
        for container in spec.get("initContainers") or []:
            code = await self._run_to_end(container, mounts_by_volume, running)
            if code != 0:
                await self._finish(running, code, "Error", init=container["name"])
                return
        main = spec["containers"][0]
        command, env = container_process(main, mounts_by_volume, running.directory / "home", running.name)
        running.log = self.logs[running.name] = self.api.logs[running.name] = running.directory / "kernel.log"
        with open(running.log, "wb") as log:
            running.process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                cwd=running.directory / "home",
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        for reason, message in (
            ("Pulled", f'Container image "{main["image"]}" already present on machine'),
            ("Created", f"Created container {main['name']}"),
            ("Started", f"Started container {main['name']}"),
        ):
            await post_event(self.api, pod, reason, message, "Normal", "kubelet")
        async with self.api._lock:
            current = self.api.get(PODS, running.namespace, running.name)
            if current is None:
                return
            started = now()
            current["status"].update(
                {
                    "phase": "Running",
                    "podIP": running.ip,
                    "podIPs": [{"ip": running.ip}],
                    "hostIP": "127.0.0.1",
                    "startTime": started,
                    "initContainerStatuses": [
                        {
                            "name": c["name"],
                            "image": c["image"],
                            "imageID": image_id(c["image"]),
                            "ready": True,
                            "restartCount": 0,
                            "state": {
                                "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": started}
                            },
                        }
                        for c in spec.get("initContainers") or []
                    ],
                    "containerStatuses": [
                        {
                            "name": main["name"],
                            "image": main["image"],
                            "imageID": image_id(main["image"]),
                            "ready": True,
                            "started": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": started}},
                        }
                    ],
                    "conditions": [
                        {"type": kind, "status": "True", "lastTransitionTime": started}
                        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                    ],
                }
            )
            await self.api.store(PODS, current)

    async def _pull_failure(self, pod: dict[str, Any], image: str) -> None:
        name = pod["metadata"]["name"]
        first = name not in self._pull_failed
        loop = asyncio.get_running_loop()
        since = self._pull_failed.setdefault(name, loop.time())
        reason = "ErrImagePull" if loop.time() - since < 1.0 else "ImagePullBackOff"
        message = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
            if reason == "ErrImagePull"
            else f'Back-off pulling image "{image}"'
        )
        async with self.api._lock:
            current = self.api.get(PODS, pod["metadata"]["namespace"], name)
            if current is None:
                return
            waiting = {"waiting": {"reason": reason, "message": message}}
            init = (current["spec"].get("initContainers") or [None])[0]
            target = init or current["spec"]["containers"][0]
            key = "initContainerStatuses" if init else "containerStatuses"
            old = ((current["status"].get(key) or [{}])[0].get("state") or {}).get("waiting") or {}
            if old.get("reason") == reason:
                return
            current["status"][key] = [
                {
                    "name": target["name"],
                    "image": image,
                    "imageID": "",  # nothing pulled
                    "ready": False,
                    "restartCount": 0,
                    "state": waiting,
                }
            ]
            await self.api.store(PODS, current)
        if first:
            await post_event(self.api, pod, "Pulling", f'Pulling image "{image}"', "Normal", "kubelet")
        await post_event(
            self.api, pod, "Failed", f'Failed to pull image "{image}": {message}', "Warning", "kubelet"
        )

    async def _run_to_end(self, container: dict[str, Any], volumes: dict[str, Path], running: Running) -> int:
        command, env = container_process(container, volumes, running.directory / "home", running.name)
        process = await asyncio.create_subprocess_exec(*command, env=env, cwd=running.directory / "home")
        return await process.wait()

    async def _watch(self, pod: dict[str, Any], running: Running) -> None:
        if running.process is None or running.ended or running.stopping:
            return
        code = running.process.returncode
        if code is not None:
            await self._finish(running, code, "Completed" if code == 0 else "Error")

    async def _finish(
        self, running: Running, code: int, reason: str, *, init: str | None = None, message: str = ""
    ) -> None:
        """The container ended on its own (or was OOM-killed): the pod's final status."""
        running.ended = True
        self._check_secrets(running)
        async with self.api._lock:
            current = self.api.get(PODS, running.namespace, running.name)
            if current is None:
                return
            finished = now()
            terminated = {"exitCode": code, "reason": reason, "finishedAt": finished}
            if message:
                terminated["message"] = message
            key = "initContainerStatuses" if init else "containerStatuses"
            spec = current["spec"]
            ended = next(c for c in spec.get("initContainers") or [] if c["name"] == init) if init else None
            container = ended or spec["containers"][0]
            current["status"][key] = [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": image_id(container["image"]),
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ]
            current["status"]["phase"] = "Succeeded" if code == 0 and not init else "Failed"
            current["status"]["conditions"] = [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": finished}
            ]
            await self.api.store(PODS, current)

    async def terminate(self, pod: dict[str, Any]) -> None:
        """A pod marked for deletion: stop its containers within the grace period, then let the
        API forget it."""
        running = self.running.get(pod["metadata"]["uid"])
        if running is not None and not running.stopping:
            grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            await self._stop(running, grace=min(grace, 5))
        if running is not None:
            self.running.pop(running.uid, None)
        async with self.api._lock:
            await self.api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _stop(self, running: Running, grace: float) -> None:
        running.stopping = True
        process = running.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            try:
                await asyncio.wait_for(process.wait(), timeout=max(grace, 0.1))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        self._check_secrets(running)
        shutil.rmtree(running.directory / "volumes", ignore_errors=True)

    def _check_secrets(self, running: Running) -> None:
        for name in secret_writes(running.secret_digests):
            self.violations.append(f"pod {running.name} wrote into its read-only Secret volume: {name}")
        running.secret_digests.clear()

    # -- what a test does to a pod --

    async def oom_kill(self, name: str) -> None:
        running = next(r for r in self.running.values() if r.name == name)
        assert running.process is not None
        running.stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signal.SIGKILL)
        await running.process.wait()
        await self._finish(running, 137, "OOMKilled")

    async def shutdown(self) -> None:
        for running in list(self.running.values()):
            await self._stop(running, grace=0)
        self.running.clear()
