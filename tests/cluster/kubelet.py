"""The kubelets of the simulated nodes: run the pods the real scheduler bound to them as local
processes, and report their status through the API as kubelet does, each as its node's identity.

For a pod bound to one of its nodes, the kubelet "pulls" its images (an unknown image fails
with ``ErrImagePull``, then ``ImagePullBackOff``), reads its Secrets (the Node authorizer lets a
node read only those of its own pods; a Secret not there yet is a ``FailedMount`` and a retry),
lays out its volumes (volumes.py), adds what the DRA driver gives the container for its
allocated claims (dra_devices.py), runs the init and main containers' commands with the pod's
environment (mount paths rewritten to the temp dirs), gives the pod its own loopback address
as pod IP (:class:`PodAddresses`: 127.X.Y.2–254, as CNI's host-local IPAM hands out a node's
range), and patches ``status`` (phase, IPs, container states,
conditions), posting the events kubelet posts. A pod marked for deletion is stopped within its
grace period (at most 5 s here), its final status written, and deleted for good (grace 0, as
kubelet's status manager does); a test can OOM-kill one. Any write into a Secret volume is a
violation the test sees.

The node side (node_side.py) calls :meth:`Kubelet.sync` for every version of a pod its watch
sees and :meth:`~Kubelet.forget` when one is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import shutil
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .containers import container_process, image_id, pod_event
from .device_plugins import device_plugin_environment
from .dra_devices import claim_environment
from .nodes import timestamp
from .rest import EVENTS, PODS, RESOURCE_CLAIMS, SECRETS, ApiError, AsyncApi
from .volumes import secret_files, secret_writes, write_secret_volume

PULL_BACKOFF_AFTER = 1.0  # seconds of ErrImagePull before kubelet says ImagePullBackOff
MOUNT_RETRY = 0.5  # seconds between tries of a Secret volume that cannot be read yet
MAX_GRACE = 5.0  # the most a deleted pod's processes get to end (its grace period, capped)


@dataclass
class Running:
    """A pod the node runs: its process, directories and what its Secret volumes held."""

    uid: str
    node: str
    namespace: str
    name: str
    ip: str
    directory: Path
    process: asyncio.subprocess.Process | None = None
    secret_digests: dict[Path, str] = field(default_factory=dict)
    ended: bool = False
    stopping: bool = False
    log: Path | None = None
    started_at: str = ""
    exit_code: int | None = None


class PodAddresses:
    """Pod IPs from one /24 as CNI's host-local IPAM hands out a node's range: the next free
    address after the last one given, wrapping around; an address is free again once its pod is
    gone. (Counting on past .254 gave addresses the API server refuses: after 253 pods in a node
    side's life, every pod's status was refused and none showed Running.)"""

    HOSTS = range(2, 255)  # .1: the bridge's gateway; .255: broadcast

    def __init__(self, subnet: str) -> None:
        self.subnet = subnet  # 127.X.Y
        self._held: set[int] = set()
        self._last = self.HOSTS[-1]  # the first address given is .2

    def take(self) -> str:
        first = self.HOSTS.index(self._last) + 1
        for step in range(len(self.HOSTS)):
            host = self.HOSTS[(first + step) % len(self.HOSTS)]
            if host not in self._held:
                self._held.add(host)
                self._last = host
                return f"{self.subnet}.{host}"
        raise RuntimeError(f"no pod address left in {self.subnet}.0/24: {len(self._held)} pods hold one each")

    def release(self, address: str) -> None:
        self._held.discard(int(address.rsplit(".", 1)[1]))


class Kubelet:
    """The pods of all simulated nodes, run in ``workdir``; ``apis`` acts as each node."""

    def __init__(
        self,
        apis: Mapping[str, AsyncApi],
        workdir: Path,
        violations: list[str],
        broken_images: Iterable[str] = (),
        devices: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    ) -> None:
        self.apis = apis
        self.workdir = workdir
        self.violations = violations
        self.broken_images = set(broken_images)
        self.devices = devices or {}  # the DRA driver's devices by (pool, name)
        self.running: dict[str, Running] = {}  # pod uid -> its process and directories
        self.logs: dict[str, Path] = {}  # pod name -> the kernel's stdout and stderr
        self.log_paths: dict[tuple[str, str], Path] = {}  # (namespace, pod) -> its log (kubelet_server.py)
        self._tasks: dict[str, asyncio.Task[None]] = {}  # pod uid -> starting or watching it
        self._terminating: set[str] = set()
        # A loopback subnet of this node side's own (127.X.Y.0/24): two test runs on one machine
        # (the fixed kernel ports of pods) cannot collide.
        self.addresses = PodAddresses(f"127.{random.randint(1, 254)}.{random.randint(0, 254)}")

    # -- what the node side calls ---------------------------------------------------------------

    async def sync(self, node: str, pod: dict[str, Any]) -> None:
        """A version of a pod bound to ``node``: start it when new, stop it when marked deleted."""
        uid = pod["metadata"]["uid"]
        if pod["metadata"].get("deletionTimestamp"):
            if uid not in self._terminating:
                self._terminating.add(uid)
                self._spawn(f"terminate-{uid}", lambda: self._terminate(node, pod))
            return
        phase = (pod.get("status") or {}).get("phase")
        if uid not in self._tasks and phase == "Pending":
            self._tasks[uid] = self._spawn(f"pod-{uid}", lambda: self._run_pod(node, pod))

    async def forget(self, uid: str) -> None:
        """A pod the API no longer has (deleted with grace 0): kill what runs and forget it."""
        task = self._tasks.pop(uid, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        running = self.running.pop(uid, None)
        if running is not None:
            await self._stop(running, grace=0)
            self.addresses.release(running.ip)
        self._terminating.discard(uid)

    async def oom_kill(self, name: str) -> None:
        """The kernel of pod ``name`` killed as the OOM killer does: its pod fails ``OOMKilled``."""
        running = next(r for r in self.running.values() if r.name == name)
        assert running.process is not None
        running.stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signal.SIGKILL)
        await running.process.wait()
        await self._finish(running, 137, "OOMKilled")

    async def shutdown(self) -> None:
        for uid in list(self._tasks):
            await self.forget(uid)
        for running in list(self.running.values()):
            await self._stop(running, grace=0)
        self.running.clear()

    # -- a pod's life ---------------------------------------------------------------------------

    def _spawn(self, name: str, work: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        # ``work`` is called inside the task: a task cancelled before it ran (a pod deleted at
        # once) leaves no coroutine behind that was never awaited.
        async def guarded() -> None:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                if not gone(error):  # a pod deleted meanwhile is no error
                    self.violations.append(f"kubelet {name}: {error}")
            except Exception as error:  # the test sees it
                self.violations.append(f"kubelet {name}: {error!r}")

        return asyncio.create_task(guarded(), name=name)

    async def _run_pod(self, node: str, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        images = [c["image"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
        broken = next((image for image in images if image in self.broken_images), None)
        if broken is not None:
            await self._pull_failure(node, pod, broken)
            return
        running = Running(
            metadata["uid"],
            node,
            metadata["namespace"],
            metadata["name"],
            self.addresses.take(),
            self.workdir / f"{metadata['name']}-{metadata['uid'][:8]}",
        )
        self.running[running.uid] = running
        volumes = await self._mount(node, pod, running)
        claims_env = await self._claims_environment(node, pod)
        for container in spec.get("initContainers") or []:
            code = await self._run_to_end(container, volumes, running, claims_env)
            if code != 0:
                await self._finish(running, code, "Error", init=container["name"])
                return
        main = spec["containers"][0]
        devices_env = {**device_plugin_environment(main, node), **claims_env}
        command, env = container_process(main, volumes, running.directory / "home", running.name, devices_env)
        running.log = running.directory / "kernel.log"
        self.logs[running.name] = self.log_paths[(running.namespace, running.name)] = running.log
        with open(running.log, "wb") as log:
            running.process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                cwd=running.directory / "home",
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        running.started_at = timestamp()
        for reason, message in (
            ("Pulled", f'Container image "{main["image"]}" already present on machine'),
            ("Created", f"Created container: {main['name']}"),
            ("Started", f"Started container {main['name']}"),
        ):
            await self._event(node, pod, reason, message)
        await self._patch_status(running, self._running_status(pod, running))
        code = await running.process.wait()
        if not running.stopping:
            await self._finish(running, code, "Completed" if code == 0 else "Error")

    async def _mount(self, node: str, pod: dict[str, Any], running: Running) -> dict[str, Path]:
        """The pod's volumes under its directory, by volume name; waits (as kubelet retries the
        mount) while a Secret is missing or not yet readable by this node."""
        (running.directory / "home").mkdir(parents=True, exist_ok=True)
        api, namespace = self.apis[node], running.namespace
        volumes: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            target = running.directory / "volumes" / volume["name"]
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                secret = await self._read_secret(node, api, pod, volume["name"], name, namespace)
                files = secret_files(secret, running.ip)
                mode = int(volume["secret"].get("defaultMode", 0o644))
                running.secret_digests.update(write_secret_volume(target, files, mode))
            else:  # emptyDir (and anything else: an empty directory)
                target.mkdir(parents=True)
            volumes[volume["name"]] = target
        return volumes

    async def _read_secret(
        self, node: str, api: AsyncApi, pod: dict[str, Any], volume: str, name: str, namespace: str
    ) -> dict[str, Any]:
        reported = False
        while True:
            try:
                secret = await api.get(SECRETS, name, namespace)
            except ApiError as error:
                # The Node authorizer learns of the pod's binding from its own watch: a read
                # right after the binding may be refused for a moment.
                if error.status != 403:
                    raise
                secret = None
            else:
                if secret is None and not reported:
                    reported = True
                    message = f'MountVolume.SetUp failed for volume "{volume}" : secret "{name}" not found'
                    await self._event(node, pod, "FailedMount", message, "Warning")
            if secret is not None:
                return secret
            await asyncio.sleep(MOUNT_RETRY)

    async def _claims_environment(self, node: str, pod: dict[str, Any]) -> dict[str, str]:
        """What the DRA driver's node half gives the container for the pod's allocated claims."""
        references = pod["spec"].get("resourceClaims") or []
        if not references:
            return {}
        generated = {
            entry["name"]: entry.get("resourceClaimName")
            for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        allocations = []
        for reference in references:
            name = reference.get("resourceClaimName") or generated.get(reference["name"])
            if not name:
                continue
            claim = await self.apis[node].get(RESOURCE_CLAIMS, name, pod["metadata"]["namespace"])
            allocation = ((claim or {}).get("status") or {}).get("allocation")
            if allocation is None:
                self.violations.append(f"pod {pod['metadata']['name']} runs with claim {name} unallocated")
                continue
            allocations.append(allocation)
        return claim_environment(allocations, self.devices)

    async def _run_to_end(
        self, container: dict[str, Any], volumes: dict[str, Path], running: Running, extra: Mapping[str, str]
    ) -> int:
        command, env = container_process(container, volumes, running.directory / "home", running.name, extra)
        process = await asyncio.create_subprocess_exec(*command, env=env, cwd=running.directory / "home")
        return await process.wait()

    async def _pull_failure(self, node: str, pod: dict[str, Any], image: str) -> None:
        """ErrImagePull, then ImagePullBackOff, with kubelet's words and events."""
        spec = pod["spec"]
        init = (spec.get("initContainers") or [None])[0]
        target = init or spec["containers"][0]
        key = "initContainerStatuses" if init else "containerStatuses"
        await self._event(node, pod, "Pulling", f'Pulling image "{image}"')
        for reason, message in (
            (
                "ErrImagePull",
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found',
            ),
            ("ImagePullBackOff", f'Back-off pulling image "{image}"'),
        ):
            waiting = {
                "name": target["name"],
                "image": image,
                "imageID": "",  # nothing pulled
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            status = {key: [waiting], "conditions": self._conditions(pod, ready=False)}
            await self.apis[node].patch(
                PODS, pod["metadata"]["name"], {"status": status}, pod["metadata"]["namespace"], "status"
            )
            event = f'Failed to pull image "{image}": {message}' if reason == "ErrImagePull" else message
            await self._event(
                node, pod, "Failed" if reason == "ErrImagePull" else "BackOff", event, "Warning"
            )
            await asyncio.sleep(PULL_BACKOFF_AFTER)

    # -- status -----------------------------------------------------------------------------------

    def _conditions(self, pod: dict[str, Any], ready: bool, reason: str = "") -> list[dict[str, Any]]:
        """The pod's conditions as kubelet keeps them (the scheduler's PodScheduled kept)."""
        now = timestamp()
        kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        state = "True" if ready else "False"
        ours = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": state, "lastTransitionTime": now},
            {"type": "Ready", "status": state, "lastTransitionTime": now},
        ]
        if reason:
            for condition in ours[2:]:
                condition["reason"] = reason
        return kept + ours

    def _running_status(self, pod: dict[str, Any], running: Running) -> dict[str, Any]:
        spec = pod["spec"]
        main = spec["containers"][0]
        return {
            "phase": "Running",
            "podIP": running.ip,
            "podIPs": [{"ip": running.ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": running.started_at,
            "initContainerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": image_id(c["image"]),
                    "containerID": container_id(running, c["name"]),
                    "ready": True,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": running.started_at,
                            "finishedAt": running.started_at,
                            "containerID": container_id(running, c["name"]),
                        }
                    },
                }
                for c in spec.get("initContainers") or []
            ],
            "containerStatuses": [
                {
                    "name": main["name"],
                    "image": main["image"],
                    "imageID": image_id(main["image"]),
                    "containerID": container_id(running, main["name"]),
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": running.started_at}},
                }
            ],
            "conditions": self._conditions(pod, ready=True),
        }

    async def _patch_status(self, running: Running, status: dict[str, Any]) -> None:
        await self.apis[running.node].patch(
            PODS, running.name, {"status": status}, running.namespace, "status"
        )

    async def _finish(
        self, running: Running, code: int, reason: str, *, init: str | None = None, message: str = ""
    ) -> None:
        """The containers ended (on their own, OOM-killed, or stopped for a deletion): the pod's
        final status."""
        if running.ended:
            return
        running.ended = True
        running.exit_code = code
        self._check_secrets(running)
        api = self.apis[running.node]
        pod = await api.get(PODS, running.name, running.namespace)
        if pod is None or pod["metadata"]["uid"] != running.uid:
            return
        spec = pod["spec"]
        ended = next(c for c in spec.get("initContainers") or [] if c["name"] == init) if init else None
        container = ended or spec["containers"][0]
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": running.started_at or timestamp(),
            "finishedAt": timestamp(),
            "containerID": container_id(running, container["name"]),
        }
        if message:
            terminated["message"] = message
        key = "initContainerStatuses" if init else "containerStatuses"
        status: dict[str, Any] = {
            "phase": "Succeeded" if code == 0 and not init else "Failed",
            key: [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": image_id(container["image"]),
                    "containerID": container_id(running, container["name"]),
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
            "conditions": self._conditions(pod, ready=False, reason="PodCompleted"),
        }
        if not running.started_at:
            status["startTime"] = terminated["startedAt"]
        await self._patch_status(running, status)

    async def _terminate(self, node: str, pod: dict[str, Any]) -> None:
        """A pod marked for deletion: stop its containers within the grace period, write the final
        status, then delete it for good, as kubelet's status manager does."""
        metadata = pod["metadata"]
        uid = metadata["uid"]
        task = self._tasks.get(uid)
        running = self.running.get(uid)
        if running is not None:
            grace = int(metadata.get("deletionGracePeriodSeconds") or 0)
            await self._stop(running, grace=min(grace, MAX_GRACE))
            if running.process is not None and running.process.returncode is not None:
                code = running.process.returncode
                await self._finish(
                    running, 128 - code if code < 0 else code, "Error" if code else "Completed"
                )
        if task is not None and not task.done():
            task.cancel()
        await self.apis[node].delete(PODS, metadata["name"], metadata["namespace"], grace=0, uid=uid)

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

    async def _event(
        self, node: str, pod: dict[str, Any], reason: str, message: str, kind: str = "Normal"
    ) -> None:
        """An event about ``pod`` from this node's kubelet."""
        await self.apis[node].create(EVENTS, pod_event(pod, reason, message, kind, "kubelet", node))


def gone(error: ApiError) -> bool:
    """Whether an answer means the pod (or what it refers to) is gone: 404, or the Node
    authorizer's 403 for an object no longer related to the node (a pod deleted, its Secret)."""
    return error.status == 404 or (error.status == 403 and "no relationship found" in error.message)


def container_id(running: Running, container: str) -> str:
    """The container's ID as a runtime reports it (``<runtime>://<id>``)."""
    return "simulated://" + hashlib.sha256(f"{running.uid}/{container}".encode()).hexdigest()[:32]
