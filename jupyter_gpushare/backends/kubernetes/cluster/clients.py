"""One place for cluster access in a process: one API client, one list+watch, one node reader.

The provisioner (pods and Secrets), the server's pool view, ``jupyter gpushare status`` and
``doctor`` all reach the cluster through here, so a server process opens one API connection and
watches nodes and kernel pods once however many kernels it starts. Clients are kept per
kubeconfig and namespace (as kubespawner keeps one shared client per process), and per process:
a forked child builds its own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from jupyter_gpushare.backends.kubernetes.cluster.cluster import Cluster, ClusterError, load_configuration
from jupyter_gpushare.backends.kubernetes.cluster.watch import ClusterWatch, Watched
from jupyter_gpushare.backends.kubernetes.objects.manifests import APP, APP_LABEL
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, read_node, read_pod
from jupyter_gpushare.core.pods.cluster import NodeGPUs
from jupyter_gpushare.core.pods.presets import ResourcePreset

NODES_CACHED_FOR = 60.0  # seconds a listing of the nodes is reused where no watch runs
FIRST_LIST_WAIT = 10.0  # seconds a first reader waits for the watch's first listing


@dataclass
class SharedCluster:
    """A process's access to one cluster namespace: the client, and the watch once started."""

    cluster: Cluster
    _watch: ClusterWatch | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listed_at: float = -NODES_CACHED_FOR
    _listed: list[dict[str, object]] = field(default_factory=list)
    _slices_at: float = -NODES_CACHED_FOR
    _slices: list[dict[str, object]] = field(default_factory=list)
    # The watched nodes as read for a preset, at the nodes' version of that watch: a broker asks
    # for them on every admission round and every start, and reading 500 nodes takes milliseconds.
    _read_nodes: tuple[Watched, int, ResourcePreset, list[NodeGPUs]] | None = None
    # Each watched node as last read, by name, with its resourceVersion: a node's status moves
    # every few seconds (its kubelet), and only the nodes that moved are read again.
    _node_reads: dict[str, tuple[object, NodeGPUs | None]] = field(default_factory=dict)
    # The same for the watched kernel pods: a broker reads them all for every start it admits,
    # and reading 2,000 pods (their environment above all) takes tens of milliseconds.
    _read_pods: tuple[Watched, int, list[PodSlice]] | None = None
    _pod_reads: dict[str, tuple[object, PodSlice | None]] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    def watch(self, dra: bool = False) -> ClusterWatch:
        """The list+watch of GPU nodes and kernel pods (and with ``dra`` of ResourceSlices,
        ResourceClaims and DeviceClasses), started on first use (one per process)."""
        with self._lock:
            if self._watch is not None and dra and self._watch.dra is None:
                self._watch.stop()  # a DRA backend came after a device-plugin one: watch more
                self._watch = None
            if self._watch is None:
                self._watch = ClusterWatch(self.cluster, dra=dra).start()
            watch = self._watch
        watch.wait_synced(FIRST_LIST_WAIT)
        return watch

    @property
    def watching(self) -> bool:
        return self._watch is not None

    def synced_watch(self) -> ClusterWatch | None:
        """The watch if it runs and has listed everything once; None where ``watch()`` would
        wait (for the lock, or for a first listing). Never starts one; an event loop may ask."""
        watch = self._watch  # one read: stop() may clear it meanwhile
        if watch is None or not watch.synced:
            return None
        return watch

    def kernel_pods(self) -> list[dict[str, object]]:
        """Every kernel pod of jupyter-gpushare in the namespace: from the watch where it runs,
        else listed now (a command asks once)."""
        if self._watch is not None:
            return self.watch().pods.items()
        return list(self.cluster.list_pods(f"{APP_LABEL}={APP}"))

    def kernel_slices(self) -> list[PodSlice]:
        """Every kernel pod's slice (:func:`read_pod`), oldest first: from the watch where it
        runs, each pod read again only once its resourceVersion moved; else listed now."""
        if self._watch is None:
            read = (read_pod(pod) for pod in self.cluster.list_pods(f"{APP_LABEL}={APP}"))
            return sorted((item for item in read if item is not None), key=lambda item: item.created)
        watched = self.watch().pods
        version, raw = watched.versioned_items()
        with self._lock:
            cached = self._read_pods
            if cached is not None and cached[:2] == (watched, version):
                return list(cached[2])
            if cached is None or cached[0] is not watched:
                self._pod_reads = {}  # another watch: nothing read before holds
            pods = sorted(read_versioned(raw, read_pod, self._pod_reads), key=lambda item: item.created)
            self._read_pods = (watched, version, pods)
        return list(pods)

    def kernel_pod(self, name: str) -> dict[str, object] | None:
        """One kernel pod of the namespace by name: from the watch where it runs, else read now."""
        if self._watch is not None:
            return self.watch().pods.get(self.namespace, name)
        pod = self.cluster.read_pod(name)
        labels = (pod or {}).get("metadata", {}).get("labels") or {}
        return pod if labels.get(APP_LABEL) == APP else None

    def gpu_nodes(self, preset: ResourcePreset) -> list[NodeGPUs]:
        """The nodes that offer GPUs, by name: from the watch where it runs, else from a listing
        reused for a minute (a console or nbclient run starting a few kernels)."""
        if self._watch is not None:
            watched = self.watch().nodes
            version, raw = watched.versioned_items()
            cached = self._read_nodes
            if cached is not None and cached[:3] == (watched, version, preset):
                return list(cached[3])
            if cached is None or cached[:1] != (watched,) or cached[2] != preset:
                self._node_reads = {}  # another watch or preset: nothing read before holds
            nodes = _read_nodes(raw, preset, self._node_reads)
            self._read_nodes = (watched, version, preset, nodes)
            return list(nodes)
        else:
            with self._lock:
                if time.monotonic() - self._listed_at >= NODES_CACHED_FOR:
                    self._listed = list(self.cluster.list_nodes())
                    self._listed_at = time.monotonic()
                raw = list(self._listed)
        return _read_nodes(raw, preset)

    def resource_slices(self) -> list[dict[str, object]]:
        """Every ResourceSlice: from the watch where it runs with DRA, else from a listing
        reused for a minute (as nodes are)."""
        if self._watch is not None and self._watch.resource_slices is not None:
            return self.watch(dra=True).resource_slices.items()  # type: ignore[union-attr]
        with self._lock:
            if time.monotonic() - self._slices_at >= NODES_CACHED_FOR:
                self._slices = list(self.cluster.list_resource_slices())
                self._slices_at = time.monotonic()
            return list(self._slices)

    def all_claims(self) -> list[dict[str, object]]:
        """Every ResourceClaim in the cluster (what is taken, and by whom): from the watch where
        it runs with DRA, else listed now."""
        if self._watch is not None and self._watch.claims is not None:
            return self.watch(dra=True).claims.items()  # type: ignore[union-attr]
        return list(self.cluster.list_all_claims())

    def stop(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.stop()
                self._watch = None


def _read_nodes(
    raw: list[dict[str, object]],
    preset: ResourcePreset,
    known: dict[str, tuple[object, NodeGPUs | None]] | None = None,
) -> list[NodeGPUs]:
    """The GPU nodes of ``raw``, read for ``preset``; with ``known`` (reads by node name and
    resourceVersion, updated here), a node whose version is the one read before is not read
    again."""
    read = (
        [read_node(node, preset) for node in raw]
        if known is None
        else read_versioned(raw, lambda node: read_node(node, preset), known)
    )
    return sorted((node for node in read if node is not None), key=lambda node: node.name)


Read = TypeVar("Read")


def read_versioned(
    raw: list[dict[str, object]],
    read: Callable[[dict[str, object]], Read | None],
    known: dict[str, tuple[object, Read | None]],
) -> list[Read]:
    """``read`` of each object of ``raw`` that reads as something; ``known`` (reads by name
    with the resourceVersion read, updated here: the names no longer there dropped) spares an
    object whose version is the one read before."""
    found, seen = [], set()
    for obj in raw:
        metadata = obj.get("metadata") or {}
        name = metadata.get("name") if isinstance(metadata, dict) else None
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        before = known.get(str(name)) if name is not None else None
        if before is not None and version is not None and before[0] == version:
            item = before[1]
        else:
            item = read(obj)
            if name is not None:
                known[str(name)] = (version, item)
        seen.add(str(name))
        if item is not None:
            found.append(item)
    for gone in set(known) - seen:
        del known[gone]
    return found


_shared: dict[tuple[str, str, int], SharedCluster] = {}
_shared_lock = threading.Lock()


def shared_cluster(namespace: str = "") -> SharedCluster:
    """This process's access to ``namespace`` (default: the kubeconfig's or service account's).

    Raises :class:`ClusterError` with the reason when no cluster is configured.
    """
    # $KUBECONFIG as it is now: tests and tools point one process at several clusters in turn.
    key = (os.environ.get("KUBECONFIG", ""), namespace, os.getpid())
    with _shared_lock:
        shared = _shared.get(key)
        if shared is None:
            found = load_configuration()
            cluster = Cluster(namespace or found.namespace, configuration=found.configuration)
            shared = _shared[key] = SharedCluster(cluster)
        return shared


def forget_shared_clusters() -> None:
    """Stop every watch and forget every client (a test's cluster is gone; a process ends)."""
    with _shared_lock:
        for shared in _shared.values():
            shared.stop()
            shared.cluster.close()
        _shared.clear()


__all__ = ["ClusterError", "SharedCluster", "forget_shared_clusters", "read_versioned", "shared_cluster"]
