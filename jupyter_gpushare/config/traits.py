"""The ``c.GPUShare`` traits (docs/reference/configuration.md), validated, and the values they resolve to.

How a process finds them (its config, the config files, the environment) is :mod:`.loading`.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Bool, Dict, Enum, Float, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from jupyter_gpushare.config import kinds
from jupyter_gpushare.config.accounting import AccountingTraits
from jupyter_gpushare.config.layers import Settled
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.modes import UnknownModeError, get_mode
from jupyter_gpushare.core.modes.registry import GROUP as MODE_GROUP
from jupyter_gpushare.core.sizes import SizeError, parse_size

LEDGER_FILENAME = "gpushare-ledger.sqlite"
# A LocalQueue's name (a DNS subdomain) that is also a label value (at most 63 characters).
_LOCAL_QUEUE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


def local_queue_problem(name: str) -> str | None:
    """Why ``name`` cannot name a Kueue LocalQueue (None: it can); for every setting naming one."""
    if _LOCAL_QUEUE.match(name):
        return None
    return (
        f"{name!r} is not a LocalQueue name (lowercase letters, digits, '-' and '.', starting and "
        "ending with a letter or digit, at most 63 characters)"
    )


class GPUShare(Configurable, AccountingTraits):
    """Fractional GPUs for Jupyter kernels (the queue's order and the accounting's traits are
    defined in ``jupyter_gpushare/config/accounting.py``)."""

    # Where each setting came from, when :func:`~jupyter_gpushare.config.load_settings` made
    # these settings (None for settings built in code).
    settled: Settled | None = None

    backend = Unicode(
        kinds.DEFAULT_KIND,
        config=True,
        help="Where kernels run: 'local' processes on this node, or 'kubernetes' pods; or a kind "
        f"another package registers under the entry-point group {kinds.GROUP}.",
    ).tag(administered=True)
    simulate = Unicode(
        "",
        config=True,
        help="Simulated pool such as '2xA100-80GB,1xT4-16GB' (no GPU needed). "
        f"Also read from ${env_names.SIMULATE}.",
    ).tag(administered=True)
    default_memory = Unicode("4G", config=True, help="Slice size when a request names none.")
    default_mode = Unicode(
        "timeslice",
        config=True,
        help="Sharing mode when a request names none: one of the installed modes "
        "(docs/how-it-works/modes.md), such as 'timeslice' or 'mps'; a package adds one under the "
        f"entry-point group {MODE_GROUP}.",
    )
    sizes = List(
        Unicode(),
        default_value=["2G", "4G", "8G", "16G", "whole"],
        config=True,
        help="Size presets offered in the UI, kernelspecs and profiles.",
    )
    overcommit = Float(1.0, config=True, help="Reserved memory may reach capacity x this (>= 1.0).").tag(
        administered=True
    )
    max_memory_per_kernel = Unicode(
        None, allow_none=True, config=True, help="Largest slice one kernel may hold, e.g. '16G'."
    ).tag(administered=True)
    max_memory_per_user = Unicode(
        None, allow_none=True, config=True, help="Most memory one user's kernels may hold together."
    ).tag(administered=True)
    min_memory = Unicode(
        "256M",
        config=True,
        help="The smallest slice a kernel may hold, e.g. '256M': a CUDA context alone takes "
        "about that much, so a smaller slice cannot run anything. Also applies to a share of "
        "a small card ('1%').",
    ).tag(administered=True)
    when_full = Enum(
        ["queue", "fail"],
        default_value="queue",
        config=True,
        help="What a request that does not fit does: wait in a FIFO queue, or fail.",
    )
    queue_timeout = Float(
        300.0, config=True, help="Seconds a queued request waits before failing with the reason."
    )
    over_limit_action = Enum(
        ["warn", "interrupt", "kill"],
        default_value="warn",
        config=True,
        help="Soft modes: what happens to a kernel above its slice.",
    )
    idle_release_after = Float(
        0.0,
        config=True,
        help="Seconds a kernel may be idle before its slice is given back (0 = never); how: idle_action.",
    )
    idle_action = Enum(
        ["suspend", "release"],
        default_value="suspend",
        config=True,
        help="What idle_release_after does to an idle kernel. 'suspend': its GPU state (every "
        "allocation and its CUDA context) moves to host memory with the CUDA driver's checkpoint "
        "API and its slice is freed for real; the next cell waits for a slice and restores it. A "
        "kernel that cannot be suspended (no driver support, MIG, several CUDA processes, not "
        "enough host memory) is released instead. 'release': the slice is given back and the "
        "kernel keeps running without one; what its processes still hold stays reserved until "
        "freed.",
    )
    idle_pod_restart = Bool(
        False,
        config=True,
        help="Kubernetes: a kernel pod cannot give GPU memory back without a new pod. True: a "
        "kernel pod idle for idle_release_after seconds is restarted in a new pod of its size, "
        "which frees what its process held on the GPU and loses the kernel's variables. False "
        "(default): an idle kernel pod keeps its GPU and its state.",
    )
    unused_kernel_timeout = Float(
        300.0,
        config=True,
        help="Seconds a server keeps a gpushare kernel that nobody uses: one that no notebook or "
        "console session refers to and no client is connected to (its browser tab closed right "
        "after the start) is shut down, and a start still queued whose client stopped asking "
        "after it (a closed tab) is withdrawn. Until then GET kernels marks it 'unused'. "
        "0 = never.",
    )
    ledger_path = Unicode(
        "",
        config=True,
        help="The node ledger (sqlite). Point several servers at one file to "
        f"share a node. Default: the Jupyter runtime dir. Also ${env_names.LEDGER_PATH}.",
    ).tag(administered=True)
    sample_interval = Float(
        1.0,
        config=True,
        help="Usage sampling period, seconds; also how often the ledger file is checked "
        "(a deleted ledger is put back within one period).",
    )
    ledger_lock_timeout = Float(
        10.0,
        config=True,
        help="Seconds a ledger lock is waited for before the call fails, naming the process that holds it.",
    )
    libvgpu_path = Unicode(
        "", config=True, help="Path of HAMi-core's libvgpu.so; enables mode 'vgpu' on local kernels."
    )
    mps_pipe_directory = Unicode(
        "",
        config=True,
        help="Pipe directory of a running MPS daemon (default: $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps).",
    )
    owner = Unicode(
        "", config=True, help="Whose slices these are. Default: $JUPYTERHUB_USER, then the login name."
    )
    queue_poll_interval = Float(
        0.25, config=True, help="Seconds between a queued request's checks of the ledger."
    )
    # ---- Kubernetes backend --------------------------------------------------------------
    namespace = Unicode(
        "",
        config=True,
        help="Namespace of kernel pods. Default: the server's own namespace in a cluster, else 'default'.",
    )
    kernel_image = Unicode(
        "jupyter-gpushare-kernel:0.1.0",
        config=True,
        help="Image of kernel pods: Python with ipykernel and jupyter-gpushare "
        "(see examples/kubernetes/kernel-image).",
    )
    pod_template = Dict(
        config=True,
        help="Merged into every kernel pod, e.g. {'spec': {'priorityClassName': "
        "'notebooks'}}; containers merge by name.",
    )
    resource_preset = Enum(
        ["nvidia", "hami", "volcano", "kai", "aliyun", "nvidia-dra", "hami-dra", "dra"],
        default_value="nvidia",
        config=True,
        help="How the cluster names GPU sharing resources: the NVIDIA device "
        "plugin, HAMi, Volcano vGPU, KAI or Aliyun cGPU; or Dynamic Resource Allocation "
        "(Kubernetes >= 1.34): NVIDIA's DRA driver, HAMi's DRA driver, or a DRA driver named by "
        "the dra_* traits. A DRA preset gives each kernel pod a ResourceClaim of its own.",
    )
    resource_names = Dict(
        config=True,
        help="Overrides of the preset's names, e.g. {'timeslice_gpu': "
        "'nvidia.com/gpu.shared', 'vgpu_memory': 'nvidia.com/gpumem'}.",
    )
    scheduler_name = Unicode(
        "", config=True, help="schedulerName of kernel pods (default: the preset's, if any)."
    )
    launch_timeout = Float(
        300.0, config=True, help="Seconds a kernel pod may take to be scheduled and start."
    )
    service_account = Unicode("", config=True, help="serviceAccountName of kernel pods.")
    encrypt = Bool(
        True,
        config=True,
        help="CurveZMQ encryption of kernel traffic. Kernel pods: always, the keys in their "
        "Secret. Local kernels: required — a kernel that cannot encrypt does not start — wherever "
        "other users share the node (a broker, or a ledger file other users may write), and a "
        "start is refused where the server's c.MappingKernelManager.transport_encryption (or "
        "c.KernelManager's) is set to 'disabled' there; where nobody else shares the node, that "
        "policy decides, as for every kernelspec ('auto' encrypts gpushare's kernels). False: "
        "local kernels follow that policy everywhere.",
    )
    node_selector = Dict(config=True, help="nodeSelector of kernel pods.")
    tolerations = List(Dict(), config=True, help="tolerations of kernel pods.")
    mig_profiles = List(
        Unicode(),
        config=True,
        help="MIG profiles to choose from (e.g. ['1g.10gb', '3g.40gb']) when the "
        "cluster's nodes cannot be listed.",
    )
    gpu_type = Unicode(
        "",
        config=True,
        help="The GPU type kernel pods ask for, e.g. 'A100': HAMi's nvidia.com/use-gputype "
        "annotation for vgpu pods; with a DRA preset, a CEL selector on the device's product name.",
    )
    # ---- Dynamic Resource Allocation (resource_preset nvidia-dra, hami-dra, dra) -----------------
    dra_driver = Unicode(
        "",
        config=True,
        help="DRA driver name (the domain of its device attributes and capacities in CEL), e.g. "
        "'gpu.nvidia.com'. Default: the preset's; required with resource_preset 'dra'.",
    )
    dra_device_class = Unicode(
        "",
        config=True,
        help="DeviceClass of whole or shared GPUs that kernel claims ask for, e.g. 'gpu.nvidia.com'. "
        "Default: the preset's; required with resource_preset 'dra'.",
    )
    dra_mig_device_class = Unicode(
        "",
        config=True,
        help="DeviceClass of MIG devices for mode 'mig', e.g. 'mig.nvidia.com'. Default: the preset's.",
    )
    dra_memory_capacity = Unicode(
        "",
        config=True,
        help="Name of the device capacity that holds a GPU's memory in bytes. "
        "Default: the preset's ('memory').",
    )
    dra_cores_capacity = Unicode(
        "",
        config=True,
        help="Name of a consumable device capacity of SM percent (HAMi-DRA's 'cores'), for gpu_cores. "
        "Default: the preset's.",
    )
    dra_consumable_capacity = Bool(
        None,
        allow_none=True,
        config=True,
        help="Whether the DRA driver's GPUs take several claims at once, each consuming part of "
        "their memory (consumable capacity, KEP-5075: beta in Kubernetes 1.36, alpha gate "
        "DRAConsumableCapacity in 1.34). Then timeslice, mps and vgpu claims ask for "
        "capacity.requests.memory = the slice. None: the preset's (on for hami-dra), or on where a "
        "ResourceSlice of the driver offers a device with allowMultipleAllocations.",
    )
    dra_fallbacks = List(
        Unicode(),
        config=True,
        help="With a DRA preset: modes a kernel's claim may fall back to, in order, through "
        "firstAvailable, e.g. ['mig', 'mps', 'exclusive'] (a MIG slice, else an MPS share, else a "
        "whole card). A kernel asking for one of them tries its own mode first, then the others; "
        "the mode it got is shown in GET kernels and %gpu status. Default: none.",
    )
    kai_queue = Unicode("", config=True, help="KAI scheduler queue label for kernel pods.")
    kueue_queue = Unicode(
        "",
        config=True,
        help="The Kueue LocalQueue kernel pods wait in (docs/admins/kueue.md): each pod is labelled "
        "kueue.x-k8s.io/queue-name with it, waits behind Kueue's scheduling gate until Kueue admits "
        "it, and its start says why in Kueue's words. Waiting for quota counts toward "
        "launch_timeout. Empty (default): no Kueue.",
    )
    server_url = Unicode(
        "",
        config=True,
        help="Where kernel pods reach this server to report their GPU use, e.g. "
        "'http://jupyter-alice.jupyter.svc:8888/user/alice/'. Default: this host's address, the "
        "server's port and base URL. Empty and a server on loopback only: pods report nothing.",
    )
    usage_metrics_url = Unicode(
        "",
        config=True,
        help="A HAMi-style monitor's Prometheus endpoint (e.g. "
        "'http://hami-device-plugin-monitor.kube-system:31992/metrics') read every "
        "sample_interval for the memory kernel pods use. Default: none.",
    )
    usage_metric_names = List(
        Unicode(),
        default_value=["hami_vgpu_memory_used_bytes", "vGPU_device_memory_usage_in_bytes"],
        config=True,
        help="Metric names at usage_metrics_url that carry a pod's GPU memory use in bytes.",
    )

    # ---- many users: the broker (docs/broker.md) -----------------------------------------------------
    broker_url = Unicode(
        "",
        config=True,
        help="The GPU broker this process uses instead of opening the node ledger or the cluster "
        "itself: 'unix:/run/jupyter-gpushare/broker.sock' (a team box) or "
        "'http://gpushare-broker:8765/' (a JupyterHub service). Identity and limits then come from "
        f"the broker. Empty (default): everything runs embedded, for one user. Also ${env_names.BROKER_URL}.",
    ).tag(administered=True)

    reconcile_on_start = Bool(
        True, config=True, help="Release slices of dead kernels when the pool is first opened."
    )

    @validate("backend")
    def _known_backend(self, proposal: Any) -> str:
        name = str(proposal["value"])
        installed = kinds.kind_names()
        if name not in installed:
            raise TraitError(
                f"unknown backend {name!r}: the installed kinds are {', '.join(installed)} (a package "
                f"adds one under the entry-point group {kinds.GROUP})"
            )
        return name

    @validate("kueue_queue")
    def _local_queue_name(self, proposal: Any) -> str:
        name = str(proposal["value"])
        problem = local_queue_problem(name) if name else None
        if problem is not None:
            raise TraitError(f"GPUShare.kueue_queue: {problem}")
        return name

    @validate("default_mode")
    def _known_mode(self, proposal: Any) -> str:
        name = proposal["value"]
        try:
            get_mode(name)
        except UnknownModeError as error:
            raise TraitError(f"GPUShare.default_mode: {error}") from None
        return str(name)

    @validate("dra_fallbacks")
    def _known_fallbacks(self, proposal: Any) -> list[str]:
        for name in proposal["value"]:
            try:
                get_mode(name)
            except UnknownModeError as error:
                raise TraitError(f"GPUShare.dra_fallbacks: {error}") from None
        return list(proposal["value"])

    @validate("overcommit")
    def _check_overcommit(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not 1.0 <= value < math.inf:
            raise ValueError(f"GPUShare.overcommit must be a finite number of at least 1.0, not {value}")
        return value

    @validate("default_memory", "max_memory_per_kernel", "max_memory_per_user", "min_memory")
    def _check_size(self, proposal: Any) -> str | None:
        value = proposal["value"]
        name = proposal["trait"].name
        if value is None:
            return None
        try:
            size = parse_size(value)
        except SizeError as error:
            raise ValueError(f"GPUShare.{name}: {error}") from None
        if name.startswith(("max_", "min_")) and size.form != "bytes":
            raise ValueError(f"GPUShare.{name} must be an amount such as 16G, not {value!r}")
        return str(value)

    @validate("sizes")
    def _check_sizes(self, proposal: Any) -> list[str]:
        for value in proposal["value"]:
            try:
                parse_size(value)
            except SizeError as error:
                raise ValueError(f"GPUShare.sizes: {error}") from None
        return list(proposal["value"])

    @validate(
        "queue_timeout",
        "sample_interval",
        "queue_poll_interval",
        "idle_release_after",
        "ledger_lock_timeout",
        "unused_kernel_timeout",
    )
    def _check_non_negative(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if value < 0:
            raise ValueError(f"GPUShare.{proposal['trait'].name} must not be negative")
        return value

    @validate("broker_url")
    def _check_broker_url(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value and broker_address_problem(value):
            raise ValueError(f"GPUShare.broker_url: {broker_address_problem(value)}")
        return value

    @validate("server_url", "usage_metrics_url")
    def _check_url(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        parsed = urllib.parse.urlsplit(value)
        if value and (parsed.scheme not in ("http", "https") or not parsed.hostname):
            raise ValueError(
                f"GPUShare.{proposal['trait'].name} must be an http:// or https:// URL with a host, "
                f"such as 'http://jupyter-alice.jupyter.svc:8888/user/alice/', not {value!r}"
            )
        return value

    # ---- resolved values -------------------------------------------------------------------

    def effective_simulate(self) -> str:
        return self.simulate or os.environ.get(env_names.SIMULATE, "")

    def effective_ledger_path(self) -> Path:
        path = self.ledger_path or os.environ.get(env_names.LEDGER_PATH, "")
        return Path(path).expanduser() if path else Path(jupyter_runtime_dir()) / LEDGER_FILENAME

    def effective_broker_url(self) -> str:
        return self.broker_url or os.environ.get(env_names.BROKER_URL, "").strip()

    def effective_owner(self) -> str:
        return (
            self.owner
            or os.environ.get(env_names.OWNER, "")
            or os.environ.get("JUPYTERHUB_USER", "")
            or getpass.getuser()
        )

    def min_memory_bytes(self) -> int:
        return parse_size(self.min_memory).resolve(0)

    def default_mode_object(self) -> Any:
        return get_mode(self.default_mode)

    def dra_names(self) -> dict[str, object]:
        """The ``dra_*`` traits that are set, as overrides of a DRA preset's names (field -> value)."""
        names: dict[str, object] = {
            field: value
            for field, value in (
                ("driver", self.dra_driver),
                ("device_class", self.dra_device_class),
                ("mig_device_class", self.dra_mig_device_class),
                ("memory_capacity", self.dra_memory_capacity),
                ("cores_capacity", self.dra_cores_capacity),
            )
            if value
        }
        if self.dra_consumable_capacity is not None:
            names["consumable_capacity"] = bool(self.dra_consumable_capacity)
        return names


def broker_address_problem(url: str) -> str | None:
    """Why ``url`` is not a broker address (None when it is): ``unix:/absolute/path`` or an
    ``http(s)://`` URL with a host."""
    if url.startswith("unix:"):
        path = url.removeprefix("unix:")
        return (
            None
            if path.startswith("/")
            else "a Unix socket needs an absolute path, as in unix:/run/jupyter-gpushare/broker.sock, "
            f"not {url!r}"
        )
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("http", "https") and parsed.hostname:
        return None
    return (
        "the broker's address is unix:/path/to/broker.sock or an http:// or https:// URL with a host, "
        f"such as 'http://gpushare-broker:8765/', not {url!r}"
    )
