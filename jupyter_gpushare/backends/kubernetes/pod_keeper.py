"""Who creates, looks at and deletes a kernel's pod and its objects, as the one pod provisioner
(:class:`~.provisioner.KubernetesProvisioner`) asks it: a :class:`PodKeeper`.

Two keepers, chosen from the settings by the provisioner: the server's own Kubernetes client
(:class:`~.cluster_pods.ClusterPods`), or the GPU broker over its socket
(:class:`~.pods_from_broker.BrokerPods`, ``c.GPUShare.broker_url``: the server holds no cluster
credentials). Everything about the kernel itself — its request, token, restarts with a new size,
polls, signals — is the provisioner's, the same for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_gpushare.core.slice_request import SliceRequest


@dataclass(frozen=True)
class KernelPod:
    """The pod a start asks for, as the kernel's traits stand at that moment."""

    kernel_id: str
    request: SliceRequest  # checked: a bad request fails before a keeper is asked
    memory: object  # the request as given (the broker checks it with its own limits)
    mode: object
    cores: object
    argv: tuple[str, ...]
    env: Mapping[str, str]
    kernel_name: str
    token: str  # the kernel's own-slice token, kept across restarts
    generation: int  # how many pods this kernel had before this one


@dataclass(frozen=True)
class PodEnd:
    """A kernel pod that is no longer running: ended with ``code`` and ``reason`` (``output``, the
    last lines where known), or gone (``code`` None: deleted, by us or by someone else)."""

    reason: str
    code: int | None = None
    output: str = ""


@dataclass(frozen=True)
class PodWatch:
    """What a keeper reports to and how often it looks, set by the provisioner."""

    kernel_id: str
    say: Callable[[str], None]  # what the start is doing, as a person reads it
    log: logging.Logger | logging.LoggerAdapter[Any]
    poll_interval: float
    unschedulable_grace: float


class PodKeeper(Protocol):
    """The kernel pod's creator and caretaker. Blocking work runs in threads; none of these
    raises for a pod that is already gone."""

    async def prepare(self, pod: KernelPod, checked: bool) -> None:
        """Check ``pod`` (unless the server ``checked`` it) and make ready what the launch
        creates; nothing exists in the cluster yet."""

    async def rebuild(self, pod: KernelPod) -> None:
        """Make ready the next launch from ``pod`` after a resize the cluster could not place."""

    async def launch(self, pod: KernelPod, timeout: float) -> dict[str, Any]:
        """Create the pod and wait for it to run: its connection info (``ip`` included). A
        failed start leaves nothing behind and raises with the cluster's reason."""

    def new_pod(self) -> object:
        """Tell the server's browsers that the kernel is in a new pod (how many reconnect)."""

    def check(self, memory: object, mode: object, cores: object) -> object:
        """Raise, with the reason, where a slice of ``memory`` cannot be had (blocking)."""

    async def look(self) -> PodEnd | None:
        """One look at the running pod: None while it runs (or nobody can say)."""

    async def delete_pod(self, grace_period_seconds: int | None) -> None:
        """Delete the pod (its Secret and claim stay until :meth:`remove`)."""

    async def remove(self) -> None:
        """Delete the pod and its objects, whatever state they are in (a kernel's cleanup)."""

    def describe(self) -> dict[str, Any]:
        """Where the pod is, for the kernel's saved provisioner info."""


__all__ = ["KernelPod", "PodEnd", "PodKeeper", "PodWatch"]
