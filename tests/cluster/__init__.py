"""The test cluster: Kubernetes' own control plane, built from its Go modules, and simulated GPU
nodes — what every cluster test runs against, and what ``make cluster`` starts.

Real: kube-apiserver (with etcd), kube-scheduler and kube-controller-manager, from
``k8s.io/kubernetes`` at the version ``controlplane/go.mod`` pins, in one process
(``controlplane/``, a Go program; build.py builds it once into ``build/cluster/bin``), with RBAC
and the Node authorizer on, ServiceAccount tokens, and the DRA feature gates our docs ask for.
Simulated (the node side of most tests, for scale and speed): the Nodes and what they advertise,
their Leases, the kubelets running bound pods as local processes, and the node half of DRA
drivers. Real, where a test asks for it (``make_kube(real_node=True)``, and ``make cluster``):
one node of Kubernetes' own kubelet on containerd and runc with CNI bridge networking
(real_node.py).

One job per module:

* build.py — builds and finds the control plane binary (keyed by version and source hash);
* nvidia_device_plugin.py — NVIDIA's device plugin built unmodified from its Go module
  (deviceplugin/), with a kubelet stub, and how it runs over the simulated NVML;
* controlplane.py — :class:`ControlPlane`: the binary as a process, its readiness, identities
  (administrator, a user in groups, a ServiceAccount's token) and kubeconfigs;
* pki.py — client and serving certificates from the cluster's CA;
* rest.py — the API as JSON (:class:`Api`, :class:`AsyncApi` with watches) and the kinds
  (``PODS``, ``SECRETS``, ``RESOURCE_CLAIMS``, …);
* nodes.py — :class:`SimNode` and the usual four 80 GiB nodes per device plugin
  (:func:`hami_nodes`, :func:`device_plugin_nodes`, …, :func:`dra_nodes`);
* dra_devices.py — DeviceClasses and ResourceSlices as NVIDIA's and HAMi's DRA drivers publish
  them (:func:`nvidia_driver`, :func:`hami_driver`), and the environment an allocated claim gives;
* volumes.py — Secret volumes laid out as kubelet lays them out;
* kubelet.py, kubelet_server.py — running bound pods, their status and events; pod logs;
* real_node.py — :class:`RealNode`: the kubelet (``kube-testcluster kubelet``), containerd,
  CNI and the node's network, started and stopped;
* gpu_node.py — :func:`gpu_node`: the real node as a GPU node (NVIDIA's device plugin over the
  simulated NVML, the kernel image in its containerd, GFD's labels), ready once it advertises;
* host_state.py — the host-wide state a real node changes, recorded and restored;
* node_images.py — the real node's local images (pause, busybox) as OCI archives;
* node_side.py — :class:`NodeSide`: nodes registered as themselves, Leases, slices, one pod
  watch per node, on its own event loop;
* fixture.py — :class:`KubeCluster`, what a test holds (its namespace, nodes, kubeconfigs,
  helpers), and :class:`Namespace` with the shipped RBAC;
* kueue.py — Kueue's controller built unmodified from its Go module, run against the control
  plane (its visibility API where asked), and the queues and grants tests apply;
* broker.py — the GPU broker on a Unix socket, as benchmarks and tests start it;
* kueue_rounds.py — a scripted sequence of kernel pods against Kueue's quota through the broker:
  its wait estimate against real waits;
* __main__.py — ``make cluster``.
"""

from __future__ import annotations

from .controlplane import ControlPlane, ControlPlaneError
from .dra_devices import HAMI, NVIDIA, DraDriver, claim_environment, hami_driver, nvidia_driver
from .fixture import KubeCluster, Namespace, namespace_for, shipped_rbac
from .node_images import LocalImage
from .node_side import NodeSide
from .nodes import (
    SimNode,
    aliyun_nodes,
    device_plugin_nodes,
    dra_nodes,
    hami_nodes,
    kai_nodes,
    pod_limits,
    quantity,
    volcano_nodes,
)
from .real_node import DEVICE_PLUGINS, RealNode, RealNodeError
from .rest import (
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    SERVICE_ACCOUNTS,
    Api,
    ApiError,
    AsyncApi,
    Identity,
    Kind,
)

__all__ = [
    "DEVICE_CLASSES",
    "DEVICE_PLUGINS",
    "EVENTS",
    "HAMI",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "NVIDIA",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "SECRETS",
    "SERVICE_ACCOUNTS",
    "Api",
    "ApiError",
    "AsyncApi",
    "ControlPlane",
    "ControlPlaneError",
    "DraDriver",
    "Identity",
    "Kind",
    "KubeCluster",
    "LocalImage",
    "Namespace",
    "NodeSide",
    "RealNode",
    "RealNodeError",
    "SimNode",
    "aliyun_nodes",
    "claim_environment",
    "device_plugin_nodes",
    "dra_nodes",
    "hami_driver",
    "hami_nodes",
    "kai_nodes",
    "namespace_for",
    "nvidia_driver",
    "pod_limits",
    "quantity",
    "shipped_rbac",
    "volcano_nodes",
]
