"""The doctor's checks of a cluster (``c.GPUShare.backend = "kubernetes"``): access, RBAC for
kernel pods, the GPU resources nodes advertise, and under a DRA preset the DRA facts."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.findings import Check, Findings


def cluster_checks(settings: GPUShare, inventory: object = None) -> Findings:
    """The Kubernetes kind's checks (its ``doctor_checks``); the node's own GPUs do not matter."""
    checks = check_cluster(settings)
    ready = all(check.status != "FAIL" for check in checks if check.name == "cluster")
    return Findings(checks, ready=ready, simulated=False)


def check_cluster(settings: GPUShare) -> list[Check]:
    """Cluster access, RBAC for kernel pods, and the GPU resources nodes advertise."""
    from jupyter_gpushare.backends.kubernetes.cluster.clients import shared_cluster
    from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
    from jupyter_gpushare.backends.kubernetes.objects.pool import read_node
    from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset

    try:
        cluster = shared_cluster(settings.namespace).cluster
    except ClusterError as error:
        return [
            Check(
                "cluster",
                "FAIL",
                f"no cluster configured ({error})",
                "run inside the cluster with a service account, or provide a kubeconfig",
            )
        ]
    try:
        nodes = cluster.list_nodes()
    except ClusterError as error:
        return [
            Check(
                "cluster",
                "FAIL",
                f"cannot list nodes: {error}",
                "apply examples/kubernetes/rbac.yaml (nodes: list) and check the API address",
            )
        ]
    preset = resolve_preset(settings.resource_preset, settings.resource_names, settings.dra_names())
    checks = [
        Check("cluster", "OK", f"{len(nodes)} node(s) reachable"),
        _check_rbac(cluster, preset.dra is not None),
    ]
    if settings.kueue_queue:
        checks.append(check_kueue(cluster, settings.kueue_queue))
    if preset.dra is not None:
        return [*checks, *check_dra(cluster, preset)]
    advertised: dict[str, int] = {}
    strategies = set()
    for node in filter(None, (read_node(raw, preset) for raw in nodes)):
        for name, quantity in node.allocatable.items():
            advertised[name] = advertised.get(name, 0) + int(quantity.rstrip("Mi") or 0)
        if node.sharing:
            strategies.add(node.sharing)
    if advertised:
        detail = ", ".join(f"{name}={count}" for name, count in sorted(advertised.items()))
        if strategies:
            detail += f"; sharing strategy: {', '.join(sorted(strategies))}"
        checks.append(Check("GPU resources", "OK", detail))
    else:
        checks.append(
            Check(
                "GPU resources",
                "FAIL",
                "no node advertises GPU resources",
                "install the NVIDIA device plugin or HAMi on the GPU nodes",
            )
        )
    return checks


def check_dra(cluster: Any, preset: Any) -> list[Check]:
    """Dynamic Resource Allocation: the API version served, the device classes, and whether the
    driver's devices take several claims (consumable capacity)."""
    from jupyter_gpushare.backends.kubernetes.cluster.cluster import ClusterError
    from jupyter_gpushare.backends.kubernetes.objects.dra_pool import read_slices

    names = preset.dra
    try:
        versions = cluster.resource_api_versions()
    except ClusterError as error:
        return [
            Check("DRA", "FAIL", f"cannot read the API groups: {error}", "check the API address and RBAC")
        ]
    if "v1" not in versions:
        served = f"only resource.k8s.io {', '.join(versions)}" if versions else "no resource.k8s.io API"
        return [
            Check(
                "DRA",
                "FAIL",
                f"the cluster serves {served}; preset {preset.name!r} needs resource.k8s.io/v1",
                "use Kubernetes 1.34 or later (DRA is GA there), or a device-plugin preset",
            )
        ]
    try:
        classes = sorted(item["metadata"]["name"] for item in cluster.list_device_classes())
        devices = read_slices(cluster.list_resource_slices(), names)
    except ClusterError as error:
        return [
            Check(
                "DRA",
                "FAIL",
                f"resource.k8s.io/v1 served, but {error}",
                "apply examples/kubernetes/rbac-dra.yaml (resourceslices, deviceclasses: list)",
            )
        ]
    api = Check("DRA", "OK", f"resource.k8s.io/{versions[0]} (served: {', '.join(versions)})")
    wanted = [name for name in (names.device_class, names.mig_device_class) if name]
    missing = [name for name in wanted if name not in classes]
    listed = ", ".join(classes) or "none"
    if missing:
        device_classes = Check(
            "device classes",
            "FAIL" if names.device_class in missing else "WARN",
            f"{', '.join(missing)} missing (the cluster has: {listed})",
            f"install the DRA driver {names.driver!r}, or set c.GPUShare.dra_device_class / "
            "dra_mig_device_class to the cluster's classes",
        )
    else:
        device_classes = Check("device classes", "OK", listed)
    shared = [device for device in devices if device.shared]
    on = names.consumable_capacity or bool(shared)
    consumable = Check(
        "consumable capacity",
        "OK" if on else "WARN",
        f"on: {len(shared)} of {len(devices)} {names.driver} device(s) take several claims"
        if on
        else f"off: each of the {len(devices)} {names.driver} device(s) holds one claim, so a kernel "
        "holds a whole card (MIG devices excepted)",
        "Kubernetes 1.36 has it on by default (1.34/1.35: the DRAConsumableCapacity feature gate); "
        "the driver must publish devices with allowMultipleAllocations",
    )
    if not devices:
        gpus = Check(
            "GPU devices",
            "FAIL",
            f"no ResourceSlice of {names.driver} publishes a device",
            f"install the DRA driver {names.driver!r} on the GPU nodes",
        )
    else:
        nodes = sorted({device.node for device in devices})
        mig = sum(device.is_mig for device in devices)
        gpus = Check(
            "GPU devices",
            "OK",
            f"{len(devices) - mig} GPU(s) and {mig} MIG device(s) of {names.driver} on {len(nodes)} node(s)",
        )
    return [api, device_classes, consumable, gpus]


RBAC_NEEDED = (
    ("pods", "create", ""),
    ("pods", "delete", ""),
    ("pods", "watch", ""),
    ("secrets", "create", ""),
    ("events", "list", ""),
)
RBAC_NEEDED_DRA = (
    ("resourceclaims", "create", "resource.k8s.io"),
    ("resourceclaims", "delete", "resource.k8s.io"),
)


def check_kueue(cluster: Any, queue: str) -> Check:
    """With ``c.GPUShare.kueue_queue``: whether Kueue's Workloads can be read, which is where a
    waiting kernel's reason comes from, and its visibility API, which says its place (without
    them the start still waits, saying less)."""
    import logging

    from jupyter_gpushare.backends.kubernetes.kueue_reads import PlaceReader, WorkloadReader
    from jupyter_gpushare.backends.kubernetes.objects.kueue import VISIBILITY_GROUP

    name = "Kueue"
    if not cluster.allowed("list", "workloads", "kueue.x-k8s.io"):
        return Check(
            name,
            "WARN",
            f"kernels wait in LocalQueue {queue}, but Kueue's reason for a wait is not shown: not "
            f"allowed to list workloads.kueue.x-k8s.io in namespace {cluster.namespace}",
            "apply examples/kubernetes/rbac.yaml (workloads: list) to the server's service account",
        )
    reader = WorkloadReader(cluster, logging.getLogger("jupyter_gpushare.doctor"))
    if reader.list("kueue.x-k8s.io/queue-name") is None and not reader.readable:
        return Check(
            name,
            "WARN",
            f"kernels are labelled for LocalQueue {queue}, but this cluster serves no Kueue "
            "Workload API: without Kueue they start without waiting for quota",
            "install Kueue (docs/admins/kueue.md), or unset c.GPUShare.kueue_queue",
        )
    if not cluster.allowed("get", "localqueues", VISIBILITY_GROUP, "pendingworkloads"):
        return Check(
            name,
            "WARN",
            f"kernels wait in LocalQueue {queue} saying Kueue's reason, but not their place: not "
            f"allowed to get localqueues/pendingworkloads.{VISIBILITY_GROUP} in namespace "
            f"{cluster.namespace}",
            "apply examples/kubernetes/rbac.yaml (localqueues/pendingworkloads: get) to the server's "
            "service account",
        )
    places = PlaceReader(cluster, logging.getLogger("jupyter_gpushare.doctor"))
    if places.places(queue) is None and not places.readable:
        return Check(
            name,
            "WARN",
            f"kernels wait in LocalQueue {queue} saying Kueue's reason, but not their place: Kueue "
            "serves no visibility API here",
            "turn on Kueue's VisibilityOnDemand feature gate (docs/admins/kueue.md)",
        )
    return Check(
        name, "OK", f"kernels wait in LocalQueue {queue}; Kueue's Workloads and their places are readable"
    )


def _check_rbac(cluster: Any, dra: bool = False) -> Check:
    needed = RBAC_NEEDED + (RBAC_NEEDED_DRA if dra else ())
    missing = [
        f"{verb} {resource}" for resource, verb, group in needed if not cluster.allowed(verb, resource, group)
    ]
    if missing:
        return Check(
            "RBAC",
            "FAIL",
            f"not allowed in namespace {cluster.namespace}: {', '.join(missing)}",
            "apply examples/kubernetes/rbac.yaml and rbac-dra.yaml to the server's service account"
            if dra
            else "apply examples/kubernetes/rbac.yaml to the server's service account",
        )
    objects = "kernel pods, Secrets and ResourceClaims" if dra else "kernel pods and Secrets"
    return Check("RBAC", "OK", f"may create and delete {objects} in {cluster.namespace}")
