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
  kubeconfig pointing at them.

The simulator has tests of its own: tests/unit/test_k8s_sim_selectors.py (the selectors) and
tests/integration/test_k8s_sim.py (a cluster driven through the official client).
"""

from __future__ import annotations

from .api import ApiServer
from .cluster import SimulatedCluster
from .kubelet import Kubelet, Running
from .node import Node
from .nodes import SimNode, hami_nodes, pod_limits, quantity
from .resources import EVENTS, KINDS, NAMESPACED, NODES, PODS, SECRETS, now, status_error
from .scheduler import Scheduler
from .selectors import FIELDS, field_matcher, label_matcher

__all__ = [
    "EVENTS",
    "FIELDS",
    "KINDS",
    "NAMESPACED",
    "NODES",
    "PODS",
    "SECRETS",
    "ApiServer",
    "Kubelet",
    "Node",
    "Running",
    "Scheduler",
    "SimNode",
    "SimulatedCluster",
    "field_matcher",
    "hami_nodes",
    "label_matcher",
    "now",
    "pod_limits",
    "quantity",
    "status_error",
]
