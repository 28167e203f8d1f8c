"""``jupyter gpushare doctor``: is this node (or cluster) ready to share GPUs, and if not, what
to do. Each check is one line — OK, WARN or FAIL — with the fix.

The last check starts a real gpushare kernel and asks it what it sees: the failure users fear
most is a notebook that silently falls back to the CPU after moving to a shared GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from .config import GPUShare
from .inventory import Inventory, discover
from .modes import probe_node

Status = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text}\n      fix: {self.fix}" if self.fix and self.status != "OK" else text


def check_gpus(inventory: Inventory) -> Check:
    if inventory.simulated:
        names = ", ".join(device.name for device in inventory.devices)
        return Check(
            "GPUs",
            "WARN",
            f"simulated pool ({names}); no real GPU is used",
            "unset c.GPUShare.simulate / JUPYTER_GPUSHARE_SIMULATE on a GPU node",
        )
    if not inventory.devices:
        return Check(
            "GPUs",
            "FAIL",
            inventory.problem or "no GPU found",
            "install the NVIDIA driver (nvidia-smi must work), or set "
            "JUPYTER_GPUSHARE_SIMULATE=1xA100-80GB to try gpushare without a GPU",
        )
    names = ", ".join(f"{device.label} {device.name}" for device in inventory.devices)
    driver = inventory.details.get("driver", "?")
    return Check("GPUs", "OK", f"{len(inventory.devices)} via NVML (driver {driver}): {names}")


def check_mig(inventory: Inventory) -> Check:
    instances = [(device.label, instance.profile) for device in inventory.devices for instance in device.mig]
    if instances:
        return Check(
            "MIG", "OK", f"{len(instances)} instance(s): " + ", ".join(f"{d} {p}" for d, p in instances)
        )
    return Check(
        "MIG",
        "WARN",
        "no MIG instances: mode 'mig' is unavailable",
        "on A100/H100: nvidia-smi -i 0 -mig 1, then nvidia-smi mig -cgi 1g.10gb -C",
    )


def check_mps(settings: GPUShare, inventory: Inventory) -> Check:
    facts = probe_node(inventory, mps_pipe_directory=settings.mps_pipe_directory)
    if facts.mps_pipe_directory:
        return Check("MPS", "OK", f"control daemon answering in {facts.mps_pipe_directory}")
    return Check(
        "MPS",
        "WARN",
        "no MPS control daemon: mode 'mps' is unavailable",
        "start it with nvidia-cuda-mps-control -d (or set c.GPUShare.mps_pipe_directory)",
    )


def check_vgpu(settings: GPUShare) -> Check:
    path = settings.libvgpu_path
    if not path:
        return Check(
            "HAMi-core",
            "WARN",
            "c.GPUShare.libvgpu_path is not set: mode 'vgpu' is unavailable locally",
            "build HAMi-core and set c.GPUShare.libvgpu_path to libvgpu.so",
        )
    if not os.path.isfile(path):
        return Check("HAMi-core", "FAIL", f"{path} does not exist", "fix c.GPUShare.libvgpu_path")
    return Check("HAMi-core", "OK", f"{path}")


def check_ledger(settings: GPUShare) -> Check:
    from .ledger import Ledger

    path = settings.effective_ledger_path()
    try:
        ledger = Ledger(path)
        records = ledger.records()
    except Exception as error:  # any sqlite or filesystem problem is the finding
        return Check(
            "ledger",
            "FAIL",
            f"{path}: {error}",
            "point c.GPUShare.ledger_path at a writable local (not NFS) directory",
        )
    return Check("ledger", "OK", f"{path} ({len(records)} slice(s) or queued request(s))")


def check_broker(settings: GPUShare) -> Check:
    """With ``broker_url``: the broker answers, and says who it takes this user for."""
    from .backends.transport import BrokerClient
    from .errors import GPUShareError

    url = settings.effective_broker_url()
    try:
        info = BrokerClient(url).call("GET", "info")
    except GPUShareError as error:
        return Check(
            "broker",
            "FAIL",
            str(error),
            "start the broker (jupyter gpushare broker, or its systemd unit / hub service), or fix "
            "c.GPUShare.broker_url",
        )
    admin = ", an admin" if info.get("admin") else ""
    return Check(
        "broker",
        "OK",
        f"{url}: {info.get('backend')} backend ({info.get('location')}); you are {info.get('user')}{admin}",
    )


def check_kernelspecs() -> Check:
    from jupyter_client.kernelspec import KernelSpecManager

    names = []
    for name, entry in KernelSpecManager().get_all_specs().items():
        metadata = (entry.get("spec") or {}).get("metadata") or {}
        if (metadata.get("kernel_provisioner") or {}).get("provisioner_name") == "gpushare-provisioner":
            names.append(name)
    if names:
        return Check("kernelspecs", "OK", ", ".join(sorted(names)))
    return Check(
        "kernelspecs",
        "WARN",
        "no gpushare kernelspec is installed",
        "jupyter gpushare kernelspec install --sys-prefix",
    )


def check_cluster(settings: GPUShare) -> list[Check]:
    """Cluster access, RBAC for kernel pods, and the GPU resources nodes advertise."""
    from .k8s.clients import shared_cluster
    from .k8s.cluster import ClusterError
    from .k8s.pool import read_node
    from .k8s.presets import resolve_preset

    try:
        cluster = shared_cluster(settings.namespace).cluster
    except ClusterError as error:
        status: Status = "FAIL" if settings.backend == "kubernetes" else "WARN"
        return [
            Check(
                "cluster",
                status,
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
    from .k8s.cluster import ClusterError
    from .k8s.dra_pool import read_slices

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


TEST_KERNEL_CODE = """
import json, os
seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "memory": os.environ.get("JUPYTER_GPUSHARE_MEMORY_BYTES")}
try:
    import torch
    seen["torch_cuda"] = torch.cuda.is_available()
    seen["device"] = torch.cuda.get_device_name(0) if seen["torch_cuda"] else None
except ImportError:
    seen["torch_cuda"] = None
print(json.dumps(seen))
"""


def check_test_kernel(inventory: Inventory, size: str = "512M") -> Check:
    """Start a real gpushare kernel with a small slice and ask what it sees."""
    if not inventory.devices:
        return Check("test kernel", "FAIL", "not started: no GPU in the pool", "fix the GPUs check first")
    try:
        seen = asyncio.run(_run_test_kernel(size))
    except Exception as error:
        return Check(
            "test kernel",
            "FAIL",
            f"could not start a gpushare kernel: {error}",
            "check the ledger and kernelspec lines above, and the server log",
        )
    if not seen.get("visible") or not seen.get("memory"):
        return Check("test kernel", "FAIL", f"the kernel got no slice ({seen})", "report this as a bug")
    where = f"CUDA_VISIBLE_DEVICES={seen['visible']}, slice {int(seen['memory']) // 2**20} MiB"
    if inventory.simulated:
        return Check(
            "test kernel",
            "WARN",
            f"{where}; simulated pool, so no framework can use a GPU",
            "run doctor on a GPU node for the real check",
        )
    if seen.get("torch_cuda") is False:
        return Check(
            "test kernel",
            "FAIL",
            f"{where}, but PyTorch sees no CUDA device: notebooks would silently run on the CPU",
            "install a CUDA build of PyTorch and check the driver "
            "(and libvgpu.so / the MPS daemon for those modes)",
        )
    if seen.get("torch_cuda") is None:
        return Check("test kernel", "OK", f"{where} (PyTorch not installed: framework check skipped)")
    return Check("test kernel", "OK", f"{where}; PyTorch sees {seen.get('device')}")


async def _run_test_kernel(size: str) -> dict[str, Any]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    from .kernelspec import build_kernelspec

    with tempfile.TemporaryDirectory() as directory:
        spec_dir = Path(directory) / "kernels" / "gpushare-doctor"
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps(build_kernelspec(size)))
        manager = AsyncKernelManager(
            kernel_name="gpushare-doctor",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(Path(directory) / "kernels")]),
        )
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        lines: list[str] = []
        try:
            await client.wait_for_ready(timeout=60)

            def collect(message: dict[str, Any]) -> None:
                if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                    lines.append(message["content"]["text"])

            await client.execute_interactive(TEST_KERNEL_CODE, output_hook=collect, timeout=120)
        finally:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)
    output = "".join(lines).strip().splitlines()
    return json.loads(output[-1]) if output else {}


def run_checks(settings: GPUShare, *, kernel: bool = True) -> list[Check]:
    inventory = discover(settings.effective_simulate())
    # With a broker, the ledger and the cluster are the broker's: this user reaches neither.
    shared = [check_broker(settings)] if settings.effective_broker_url() else None
    checks = [
        check_gpus(inventory),
        check_mig(inventory),
        check_mps(settings, inventory),
        check_vgpu(settings),
        *(shared or [check_ledger(settings)]),
        check_kernelspecs(),
        *([] if shared else check_cluster(settings)),
    ]
    if kernel:
        checks.append(check_test_kernel(inventory))
    return checks


def report(checks: list[Check], as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {"ok": all(c.status != "FAIL" for c in checks), "checks": [asdict(c) for c in checks]}, indent=2
        )
    failed = sum(check.status == "FAIL" for check in checks)
    warned = sum(check.status == "WARN" for check in checks)
    lines = [check.line() for check in checks]
    lines.append(f"{len(checks)} checks: {failed} FAIL, {warned} WARN")
    return "\n".join(lines)
