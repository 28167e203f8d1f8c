"""A Kubernetes cluster for tests: an API server and GPU nodes, all on loopback, no cluster needed.

One job per module:

* resources.py — the kinds served (``PODS``, ``SECRETS``, ``EVENTS``, ``NODES``), the API's
  timestamps and ``Status`` errors;
* selectors.py — label and field selectors as the API parses and applies them;
* api.py — :class:`ApiServer`, kmock's ``KubernetesEmulator`` (a real HTTP server) with the real
  API's semantics for what the backend uses: selectors, 404/409/400 ``Status`` answers, object
  metadata, Secrets' stringData, pod logs, graceful pod deletion;
* nodes.py — :class:`SimNode` (``hami_nodes`` gives four 80 GiB HAMi nodes) and the resources
  a pod asks of one;
* events.py — events posted as the scheduler and kubelet post them;
* scheduler.py — binds pods that fit a node's allocatable resources, or posts
  ``FailedScheduling`` with the scheduler's wording;
* volumes.py — Secret and emptyDir volumes laid out as kubelet lays them out (``..data``
  symlinks), and the check that nothing wrote into a Secret volume;
* kubelet.py — runs bound pods' containers as local processes with their own loopback pod IP,
  fails unknown images with ``ErrImagePull``, reports phase, container states and events, stops
  a deleted pod's process, OOM-kills on a test's request;
* node.py — :class:`Node`, the loop that drives scheduler and kubelet through the API's store;
* cluster.py — :class:`SimulatedCluster`, both on their own event loop in a thread, and a
  kubeconfig pointing at them;
* Dynamic Resource Allocation (``resource.k8s.io/v1``, served by ``ApiServer(dra=True)``, which
  ``SimulatedCluster(..., dra=...)`` makes): dra.py — :class:`DraSimulation`, the DRA part of the
  scheduler (claims matched to devices by CEL selectors, capacity consumed, ``status.allocation``
  written, an unsatisfiable claim's pod left pending with the scheduler's words) and the claim
  controllers (claims from templates, garbage collection); cel.py — the small CEL evaluator for the
  subset the presets and drivers emit; dra_devices.py — DeviceClasses and ResourceSlices as
  NVIDIA's and HAMi's DRA drivers publish them, and the clusters the DRA tests run.

The simulator has tests of its own: tests/unit/test_k8s_sim_selectors.py (the selectors) and
tests/integration/test_k8s_sim.py (a cluster driven through the official client).
"""

from __future__ import annotations

from .api import ApiServer
from .cluster import SimulatedCluster
from .dra import DraSimulation, consumed_per_device
from .dra_devices import HAMI, NVIDIA, dra_nodes, hami_cluster, nvidia_cluster
from .kubelet import Kubelet, Running
from .node import Node
from .nodes import SimNode, hami_nodes, pod_limits, quantity
from .resources import (
    CANNOT_ALLOCATE,
    DEVICE_CLASSES,
    EVENTS,
    KINDS,
    NAMESPACED,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    now,
    status_error,
)
from .scheduler import Scheduler
from .selectors import FIELDS, field_matcher, label_matcher

__all__ = [
    "CANNOT_ALLOCATE",
    "DEVICE_CLASSES",
    "EVENTS",
    "FIELDS",
    "HAMI",
    "KINDS",
    "NAMESPACED",
    "NODES",
    "NVIDIA",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "SECRETS",
    "ApiServer",
    "DraSimulation",
    "Kubelet",
    "Node",
    "Running",
    "Scheduler",
    "SimNode",
    "SimulatedCluster",
    "consumed_per_device",
    "dra_nodes",
    "field_matcher",
    "hami_cluster",
    "hami_nodes",
    "label_matcher",
    "now",
    "nvidia_cluster",
    "pod_limits",
    "quantity",
    "status_error",
]
